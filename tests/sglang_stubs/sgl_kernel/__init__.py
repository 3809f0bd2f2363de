"""hsmon's stand-in for sgl-kernel, whose CPU build is not published on PyPI.

With SGLANG_USE_CPU_ENGINE=1, SGLang imports a few ``*_cpu`` kernels from sgl_kernel when its
modules load; on a CPU without AMX it never calls them and uses plain torch instead. Each name
here resolves to a function that raises when called, so an unexpected call fails loudly.
"""

__version__ = "0.0.0+hsmon-stub"


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def unavailable(*args: object, **kwargs: object) -> None:
        raise NotImplementedError(f"sgl_kernel.{name} is not available in hsmon's CPU stand-in")

    unavailable.__name__ = name
    return unavailable
