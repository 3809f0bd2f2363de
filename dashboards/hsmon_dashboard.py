"""The hsmon Grafana dashboard, written with Grafana's own Python SDK (grafana-foundation-sdk).

`python dashboards/hsmon_dashboard.py` writes dashboards/grafana/dashboards/hsmon.json, the file
Grafana's provisioning (dashboards/grafana/provisioning/) loads; tests/test_dashboard.py checks that
the committed JSON equals what this builds and runs every query against a real Prometheus.

Variables: `datasource` (any Prometheus), `job` and `instance` (the watched job and the daemon's
host:port, both multi-select), `sglang_instance` (SGLang servers Prometheus scrapes, if any).
The rows and panels are data, in hsmon_panels.py beside this file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh, VariableSort
from hsmon_panels import ROWS, P  # beside this file: its rows and panels as data

OUTPUT = Path(__file__).resolve().parent / "grafana" / "dashboards" / "hsmon.json"
UID = "hsmon"
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")


def rows() -> list[tuple[str, list[P]]]:
    """The dashboard's rows and panels, top to bottom (hsmon_panels.py)."""
    return ROWS


def _panel(p: P, panel_id: int) -> Any:
    builder = stat.Panel() if p.kind == "stat" else timeseries.Panel()
    builder = (builder.id(panel_id).title(p.title).datasource(DS).unit(p.unit)
               .span(p.width).height(p.height))
    if p.description:
        builder = builder.description(p.description)
    for i, q in enumerate(p.queries):
        builder = builder.with_target(prometheus.Dataquery().ref_id(chr(ord("A") + i)).datasource(DS)
                                      .expr(q.expr).legend_format(q.legend))
    if p.kind == "stat":
        builder = (builder.reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
                   .text_mode(common_m.BigValueTextMode[p.text_mode])
                   .graph_mode(common_m.BigValueGraphMode.NONE))
    else:
        builder = builder.legend(common_b.VizLegendOptions().show_legend(True)
                                 .display_mode(common_m.LegendDisplayMode.LIST)
                                 .placement(common_m.LegendPlacement.BOTTOM)).fill_opacity(10)
    if p.links:
        builder = builder.data_links([dash_b.DashboardLink(t).url(u).target_blank(True) for t, u in p.links])
    return builder


def _query_var(name: str, label: str, query: str) -> Any:
    return (dash_b.QueryVariable(name).label(label).datasource(DS).query(query)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*"))


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (a plain dict)."""
    board = (
        dash_b.Dashboard("hsmon: hidden-state extraction and drafter training")
        .uid(UID)
        .description("Jobs watched by hsmon daemons (docs/operations.md, docs/metrics.md)")
        .tags(["hsmon", "eagle3", "sglang"])
        .editable()
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .with_variable(dash_b.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(_query_var("job", "Job", "label_values(hsmon_job_state, job)"))
        .with_variable(_query_var("instance", "Daemon",
                                  'label_values(hsmon_job_state{job=~"$job"}, instance)'))
        .with_variable(_query_var("sglang_instance", "SGLang server",
                                  "label_values(sglang:num_running_reqs, instance)"))
    )
    panel_id = 1
    for title, panels in rows():
        board = board.with_row(dash_b.Row(title).id(panel_id))
        panel_id += 1
        for p in panels:
            board = board.with_panel(_panel(p, panel_id))
            panel_id += 1
    return json.loads(render_model(board.build()))


def render_model(model: Any) -> str:
    return json.dumps(model, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def render() -> str:
    """The JSON text committed as dashboards/grafana/dashboards/hsmon.json."""
    return json.dumps(build(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check, compare) the committed dashboard JSON."""
    argv = sys.argv[1:] if argv is None else argv
    text = render()
    if "--check" in argv:
        same = OUTPUT.is_file() and OUTPUT.read_text(encoding="utf-8") == text
        print(f"{OUTPUT}: {'up to date' if same else 'differs from the code: run python ' + __file__}")
        return 0 if same else 1
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
