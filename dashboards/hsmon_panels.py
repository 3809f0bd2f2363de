"""The dashboard's rows and panels, top to bottom, as data: what hsmon_dashboard.py renders.

Every metric is one of docs/metrics.md; daemon-wide ones (no `job` label of their own) carry the
scrape job's name, `hsmon`, through honor_labels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SEL = 'job=~"$job", instance=~"$instance"'
DAEMON = 'job="hsmon", instance=~"$instance"'
SGL = 'instance=~"$sglang_instance"'
WHO = "{{instance}} {{job}}"


@dataclass
class Q:
    """One query of a panel: PromQL and its legend."""

    expr: str
    legend: str = WHO


@dataclass
class P:
    """One panel. ``extraction``: concerns an extraction, so it must show data while one runs (the
    test asserts it); training, notification and SGLang panels may be empty there."""

    title: str
    queries: list[Q]
    unit: str = "short"
    kind: str = "timeseries"
    width: int = 8
    height: int = 7
    description: str = ""
    extraction: bool = True
    links: list[tuple[str, str]] = field(default_factory=list)
    text_mode: str = "VALUE_AND_NAME"


ROWS: list[tuple[str, list[P]]] = [
    ("Job", [
        P("State", [Q(f"max by (instance, job, state) (hsmon_job_state{{{SEL}}}) == 1",
                      f"{WHO}: {{{{state}}}}")],
          kind="stat", width=6, height=5, text_mode="NAME",
          description="The state the daemon decided (docs/daemon.md). The reason and the hints are "
                      "in the status API: click a value.",
          links=[("reason and hints (status API)", "http://${__field.labels.instance}/api/v1/status")]),
        P("Why: hints now",
          [Q(f"hsmon_job_hint{{{SEL}}} == 1", f"{WHO}: {{{{hint}}}} ({{{{severity}}}})")],
          kind="stat", width=8, height=5, text_mode="NAME",
          description="The hints behind the state (docs/daemon.md): stalled, process-stopped, "
                      "server-hung, disk-wont-fit, stdout-buffered ..."),
        P("Hints by severity", [Q(f"sum by (instance, job, severity) (hsmon_job_hints{{{SEL}}})",
                                  f"{WHO} {{{{severity}}}}")], kind="stat", width=4, height=5),
        P("Time in current state", [Q(f"time() - hsmon_job_state_since_timestamp_seconds{{{SEL}}}")],
          unit="s", kind="stat", width=3, height=5),
        P("State transitions in range",
          [Q(f"sum by (instance, job, state) (increase(hsmon_job_transitions_total{{{SEL}}}[$__range]))",
             f"{WHO} → {{{{state}}}}")], kind="stat", width=3, height=5),
    ]),
    ("Progress", [
        P("Rows", [Q(f"hsmon_rows_done{{{SEL}}}", f"{WHO} done"),
                   Q(f"hsmon_rows_planned{{{SEL}}}", f"{WHO} planned")]),
        P("Tokens", [Q(f"hsmon_tokens_done{{{SEL}}}", f"{WHO} done"),
                     Q(f"hsmon_tokens_planned{{{SEL}}}", f"{WHO} planned")]),
        P("Chunks", [Q(f"hsmon_chunks_done{{{SEL}}}", f"{WHO} done (events)"),
                     Q(f"hsmon_output_chunks_complete{{{SEL}}}", f"{WHO} complete (output)"),
                     Q(f"hsmon_output_chunks_in_progress{{{SEL}}}", f"{WHO} being written")]),
        P("Done", [Q(f"hsmon_rows_done{{{SEL}}} / hsmon_rows_planned{{{SEL}}}")],
          unit="percentunit", kind="stat", width=6, height=5),
        P("ETA", [Q(f"hsmon_eta_seconds{{{SEL}}}")], unit="s", kind="stat", width=6, height=5),
        P("Rows per second", [Q(f"hsmon_rows_per_second{{{SEL}}}")], width=6, height=5),
        P("Tokens per second", [Q(f"hsmon_tokens_per_second{{{SEL}}}")], width=6, height=5),
        P("Rejected rows", [Q(f"hsmon_rejected_rows{{{SEL}}}")], width=6, height=5),
        P("Progress events", [Q(f"rate(hsmon_events_lines_total{{{SEL}}}[$__rate_interval])",
                                f"{WHO} lines/s"),
                              Q(f"hsmon_events_bad_lines_total{{{SEL}}}", f"{WHO} bad lines")],
          width=6, height=5),
        P("Since last progress", [Q(f"time() - hsmon_last_progress_timestamp_seconds{{{SEL}}}")],
          unit="s", width=6, height=5),
        P("Since last work (dump files or output)",
          [Q(f"time() - hsmon_job_last_work_timestamp_seconds{{{SEL}}}", f"{WHO}"),
           Q(f"hsmon_job_stall_after_seconds{{{SEL}}}", f"{WHO} stall after")],
          unit="s", width=6, height=5),
    ]),
    ("Online: the spool and its following trainer (hsmon extract --spool-max)", [
        P("Spool: bytes waiting and limit", [Q(f"hsmon_spool_bytes{{{SEL}}}", f"{WHO} waiting"),
                                             Q(f"hsmon_spool_limit_bytes{{{SEL}}}", f"{WHO} limit")],
          unit="bytes", width=6, extraction=False,
          description="Bytes of rows written and not yet consumed; the extractor pauses at the limit."),
        P("Online rows per second", [Q(f"hsmon_online_rows_per_second{{{SEL}}}", f"{WHO} {{{{side}}}}")],
          width=6, extraction=False,
          description="extractor: rows written per second; trainer: rows consumed (every pass given)."),
        P("Online wait share (last 10 min)",
          [Q(f"hsmon_online_wait_ratio{{{SEL}}}", f"{WHO} {{{{side}}}}")], unit="percentunit", width=6,
          extraction=False,
          description="The extractor waiting for spool room: training is the bottleneck; the trainer "
                      "waiting for rows: extraction is. HsmonPipelineStopped when neither moves."),
        P("Online sides", [Q(f"hsmon_online_side_state{{{SEL}}} == 1",
                             f"{WHO} {{{{side}}}}: {{{{state}}}}"),
                           Q(f"hsmon_spool_rows_waiting{{{SEL}}}", f"{WHO} rows waiting")],
          kind="stat", width=6, text_mode="NAME", extraction=False),
    ]),
    ("Regeneration: the target's own answers (hsmon regenerate)", [
        P("Answer tokens per second", [Q(f"hsmon_regenerate_tokens_per_second{{{SEL}}}")], width=6,
          extraction=False,
          description="Tokens of the answers committed per second (the end-of-turn token not counted)."),
        P("Regeneration ETA", [Q(f"hsmon_regenerate_eta_seconds{{{SEL}}}")], unit="s", kind="stat", width=4,
          extraction=False,
          description="The rows left times the tokens a row took so far, at the token rate."),
        P("Answers by ending",
          [Q(f"sum by (instance, job, finish) (rate(hsmon_regenerate_answers_total{{{SEL}}}[5m]))",
             f"{WHO} {{{{finish}}}}")], unit="ops", width=6, extraction=False,
          description="stop: the answer ended at an end-of-turn token; length: cut at --max-new-tokens "
                      "(HsmonRegenerationTruncating above a fifth)."),
        P("Answer length: the target's against the source's",
          [Q(f"hsmon_regenerate_answer_tokens_mean{{{SEL}}}", f"{WHO} target"),
           Q(f"hsmon_regenerate_source_tokens_mean{{{SEL}}}", f"{WHO} source")], width=8,
          extraction=False, description="Mean tokens of the answers that replaced a source answer, and of "
                                        "those source answers."),
    ]),
    ("Data (per layer, from the manifest's statistics)", [
        P("Mean L2 norm per token, newest chunk",
          [Q(f"hsmon_output_layer_chunk_mean_l2_norm{{{SEL}}}", f"{WHO} layer {{{{layer}}}}")],
          extraction=False,
          description="Per captured layer and the final one (hsmon layout). A step here is a "
                      "change in what computes the data: see HsmonDataDrift."),
        P("Drift: newest chunk over the reference chunks",
          [Q(f"hsmon_output_layer_chunk_drift_ratio{{{SEL}}}", f"{WHO} layer {{{{layer}}}}")],
          extraction=False,
          description="Mean L2 norm of the newest chunk over the run's first 3 chunks'. The "
                      "drift warning fires beyond 0.75-1.25."),
        P("Rows with NaN/Inf", [Q(f"hsmon_output_nonfinite_rows{{{SEL}}}"),
                                Q(f"hsmon_output_drifted_chunks{{{SEL}}}", f"{WHO} drifted chunks")],
          kind="stat", extraction=False,
          description="hsmon train skips rows with NaN/Inf; status names the first ones."),
        P("Engine check: worst cosine of the last check",
          [Q(f"hsmon_verify_worst_cosine{{{SEL}}}", f"{WHO} worst cosine"),
           Q(f"hsmon_verify_disagree{{{SEL}}}", f"{WHO} disagrees")],
          extraction=False,
          description="hsmon daemon --verify-every N re-extracts a few rows of the newest chunk "
                      "with the reference engine; disagrees = 1 fires HsmonEngineMismatch."),
    ]),
    ("Dump directory and /dev/shm", [
        P("Dump files", [Q(f"hsmon_dump_files{{{SEL}}}")], width=6),
        P("Dump bytes", [Q(f"hsmon_dump_bytes{{{SEL}}}")], unit="bytes", width=6),
        P("Oldest dump file", [Q(f"hsmon_dump_oldest_file_age_seconds{{{SEL}}}")], unit="s", width=6,
          description="A growing age means nothing consumes the dump files."),
        P("Dump files created / consumed",
          [Q(f"rate(hsmon_dump_files_created_total{{{SEL}}}[$__rate_interval])", f"{WHO} created/s"),
           Q(f"rate(hsmon_dump_files_consumed_total{{{SEL}}}[$__rate_interval])", f"{WHO} consumed/s")],
          width=6),
        P("/dev/shm free", [Q(f'hsmon_disk_free_bytes{{{SEL}, role="shm"}}', f"{WHO} free"),
                            Q(f'hsmon_disk_size_bytes{{{SEL}, role="shm"}}', f"{WHO} size")],
          unit="bytes", width=12,
          description="node_exporter leaves /dev/shm out by default; hsmon exports it."),
        P("/dev/shm time to full vs time to done",
          [Q(f'hsmon_disk_time_to_full_seconds{{{SEL}, role="shm"}}', f"{WHO} full in"),
           Q(f'hsmon_disk_time_to_done_seconds{{{SEL}, role="shm"}}', f"{WHO} done in")],
          unit="s", width=12),
    ]),
    ("Disk headroom", [
        P("Free vs still needed", [Q(f"hsmon_disk_free_bytes{{{SEL}}}", f"{WHO} {{{{role}}}} free"),
                                   Q(f"hsmon_disk_needed_bytes{{{SEL}}}", f"{WHO} {{{{role}}}} needed")],
          unit="bytes"),
        P("Free in 1 h at the current trend (predict_linear) vs still needed",
          [Q(f"predict_linear(hsmon_disk_free_bytes{{{SEL}}}[15m], 3600)",
             f"{WHO} {{{{role}}}} free in 1 h"),
           Q(f"hsmon_disk_needed_bytes{{{SEL}}}", f"{WHO} {{{{role}}}} needed")],
          unit="bytes",
          description="Below the needed line: the disk fills before the job is done."),
        P("Time to full vs time to done",
          [Q(f"hsmon_disk_time_to_full_seconds{{{SEL}}}", f"{WHO} {{{{role}}}} full in"),
           Q(f"hsmon_disk_time_to_done_seconds{{{SEL}}}", f"{WHO} {{{{role}}}} done in")], unit="s"),
        P("Fits", [Q(f"min by (instance, job, role) (hsmon_disk_fits{{{SEL}}})", f"{WHO} {{{{role}}}}")],
          kind="stat", width=6, height=5,
          description="1: what the job still writes fits; 0: it does not."),
        P("Output bytes", [Q(f"hsmon_output_bytes{{{SEL}}}")], unit="bytes", width=6, height=5),
        P("Output write rate", [Q(f'hsmon_disk_write_bytes_per_second{{{SEL}, role="output"}}')],
          unit="Bps", width=6, height=5),
        P("Temporary files", [Q(f"hsmon_output_temp_files{{{SEL}}}")], width=6, height=5),
    ]),
    ("Processes", [
        P("Up", [Q(f"hsmon_process_up{{{SEL}}}", f"{WHO} {{{{role}}}}")], kind="stat", width=6, height=5),
        P("Restarts in range",
          [Q(f"increase(hsmon_process_restarts_total{{{SEL}}}[$__range])", f"{WHO} {{{{role}}}}")],
          kind="stat", width=6, height=5),
        P("stdout buffered", [Q(f"hsmon_process_stdout_buffered{{{SEL}}}", f"{WHO} {{{{role}}}}")],
          kind="stat", width=6, height=5,
          description="1: Python writes stdout block-buffered to a file; an empty log is not a stall."),
        P("Threads", [Q(f"hsmon_process_threads{{{SEL}}}", f"{WHO} {{{{role}}}}")], width=6, height=5),
        P("CPU (cores)", [Q(f"rate(hsmon_process_cpu_seconds_total{{{SEL}}}[$__rate_interval])",
                            f"{WHO} {{{{role}}}}")]),
        P("Resident memory", [Q(f"hsmon_process_resident_memory_bytes{{{SEL}}}", f"{WHO} {{{{role}}}}")],
          unit="bytes"),
        P("Writes (any file, tmpfs included)",
          [Q(f"rate(hsmon_process_write_chars_total{{{SEL}}}[$__rate_interval])", f"{WHO} {{{{role}}}}")],
          unit="Bps"),
    ]),
    ("Training", [
        P("Loss (first unroll step)", [Q(f"hsmon_train_loss{{{SEL}}}")], extraction=False),
        P("Accuracy (first unroll step)", [Q(f"hsmon_train_accuracy_ratio{{{SEL}}}")],
          unit="percentunit", extraction=False),
        P("Steps per second", [Q(f"deriv(hsmon_train_step{{{SEL}}}[$__rate_interval])")],
          extraction=False),
    ]),
    ("Daemon", [
        P("Scrape up", [Q(f"up{{{DAEMON}}}", "{{instance}}")], kind="stat", width=6, height=5),
        P("Reconciliation scans per second",
          [Q(f"rate(hsmon_scans_total{{{DAEMON}}}[$__rate_interval])", "{{instance}}")],
          width=6, height=5),
        P("inotify overflows in range",
          [Q(f"increase(hsmon_inotify_overflows_total{{{DAEMON}}}[$__range])", "{{instance}}")],
          kind="stat", width=6, height=5),
        P("Tick duration", [Q(f"hsmon_tick_duration_seconds{{{DAEMON}}}", "{{instance}}")],
          unit="s", width=6, height=5),
        P("Notifications", [Q(f"increase(hsmon_notifications_sent_total{{{DAEMON}}}[$__range])",
                              "{{instance}} sent"),
                            Q(f"increase(hsmon_notifications_failed_total{{{DAEMON}}}[$__range])",
                              "{{instance}} failed")],
          kind="stat", width=24, height=4, extraction=False,
          description="Only daemons started with a notify webhook export these."),
    ]),
    ("Inference servers and GPUs (seen by the daemon)", [
        P("Server state", [Q(f"max by (instance, job, server, state) (hsmon_server_state{{{SEL}}}) == 1",
                             "{{server}}: {{state}}")],
          kind="stat", width=8, height=5, text_mode="NAME", extraction=False,
          description="up, busy (a forward answers slowly), hung (the HTTP front answers, a forward does "
                      "not come back), down, unknown (docs/daemon.md)."),
        P("Since a forward last completed",
          [Q(f"time() - hsmon_server_last_forward_timestamp_seconds{{{SEL}}}", "{{server}}")],
          unit="s", width=8, height=5, extraction=False),
        P("/health_generate latency", [Q(f"hsmon_server_health_generate_seconds{{{SEL}}}", "{{server}}")],
          unit="s", width=8, height=5, extraction=False),
        P("Server requests running / queued",
          [Q(f"hsmon_server_running_requests{{{SEL}}}", "{{server}} running"),
           Q(f"hsmon_server_queued_requests{{{SEL}}}", "{{server}} queued")], extraction=False),
        P("Server throughput",
          [Q(f"hsmon_server_generation_tokens_per_second{{{SEL}}}", "{{server}} generated"),
           Q(f"hsmon_server_prompt_tokens_per_second{{{SEL}}}", "{{server}} prompt")],
          unit="tokens/s", extraction=False),
        P("Server KV cache usage", [Q(f"hsmon_server_token_usage_ratio{{{SEL}}}", "{{server}}")],
          unit="percentunit", extraction=False),
        P("GPU utilization", [Q(f"hsmon_gpu_utilization_ratio{{{DAEMON}}}", "{{instance}} GPU {{gpu}}")],
          unit="percentunit", extraction=False,
          description="Every GPU of the daemon's host (NVML). hsmon_job_gpu says which a job uses."),
        P("GPU memory used", [Q(f"hsmon_gpu_memory_used_bytes{{{DAEMON}}}", "{{instance}} GPU {{gpu}}")],
          unit="bytes", extraction=False),
        P("GPU power", [Q(f"hsmon_gpu_power_watts{{{DAEMON}}}", "{{instance}} GPU {{gpu}}")],
          unit="watt", extraction=False),
        P("GPUs a job holds memory on", [Q(f"hsmon_job_gpu{{{SEL}}} == 1", f"{WHO} GPU {{{{gpu}}}}")],
          kind="stat", width=12, height=5, text_mode="NAME", extraction=False),
        P("NVML available", [Q(f"hsmon_gpu_available{{{DAEMON}}}", "{{instance}}")], kind="stat",
          width=12, height=5,
          description="0: no nvidia-ml-py or no driver on that host; the GPU panels stay empty."),
    ]),
    ("Capture plugin inside the SGLang servers (seen by the daemon)", [
        P("Capture hook time p99 (scheduler thread)",
          [Q(f"hsmon_server_capture_hook_seconds_p99{{{SEL}}}", "{{server}}")],
          unit="s", width=8, extraction=False,
          description="Time inside hsmon's hook per request on SGLang's scheduler thread (recent "
                      "requests); the goal is <= 1 ms. Empty: no capture plugin."),
        P("Capture writer queue", [Q(f"hsmon_server_capture_queue_depth{{{SEL}}}", "{{server}}")],
          width=8, extraction=False,
          description="Requests waiting for the plugin's writer thread (a growing queue: the dump "
                      "directory's filesystem is slower than the server)."),
        P("Capture host pool",
          [Q(f"hsmon_server_capture_pool_bytes_in_use{{{SEL}}}", "{{server}} in use"),
           Q(f"hsmon_server_capture_pool_bytes_max{{{SEL}}}", "{{server}} limit")],
          unit="bytes", width=8, extraction=False,
          description="Host memory held for the writer; at the limit requests are written on the "
                      "scheduler's thread (sync fallbacks)."),
        P("Capture files written per second",
          [Q(f"rate(hsmon_server_capture_files_written_total{{{SEL}}}[$__rate_interval])", "{{server}}")],
          width=12, height=5, extraction=False),
        P("Capture errors and fallbacks in range",
          [Q(f"increase(hsmon_server_capture_write_errors_total{{{SEL}}}[$__range])",
             "{{server}} write errors"),
           Q(f"increase(hsmon_server_capture_sync_fallbacks_total{{{SEL}}}[$__range])",
             "{{server}} sync fallbacks"),
           Q(f"increase(hsmon_server_capture_buffer_reuses_total{{{SEL}}}[$__range])",
             "{{server}} buffer reuses")],
          kind="stat", width=12, height=5, extraction=False,
          description="Write errors left <rid>.error files (alert HsmonCaptureWriteErrors); buffer "
                      "reuses should stay 0 (docs/extract.md)."),
    ]),
    ("SGLang server (when Prometheus scrapes it)", [
        P("Requests running / queued", [Q(f"sglang:num_running_reqs{{{SGL}}}", "{{instance}} running"),
                                        Q(f"sglang:num_queue_reqs{{{SGL}}}", "{{instance}} queued")],
          extraction=False),
        P("Generation throughput", [Q(f"sglang:gen_throughput{{{SGL}}}", "{{instance}}")],
          unit="tokens/s", extraction=False),
        P("Prompt tokens per second",
          [Q(f"rate(sglang:prompt_tokens_total{{{SGL}}}[$__rate_interval])", "{{instance}}")],
          extraction=False),
        P("KV cache usage", [Q(f"sglang:token_usage{{{SGL}}}", "{{instance}}")], unit="percentunit",
          extraction=False),
        P("Prefix cache hit rate", [Q(f"sglang:cache_hit_rate{{{SGL}}}", "{{instance}}")],
          unit="percentunit", extraction=False),
        P("End-to-end request latency p50 / p99",
          [Q("histogram_quantile(0.5, sum by (le, instance) "
             f"(rate(sglang:e2e_request_latency_seconds_bucket{{{SGL}}}[$__rate_interval])))",
             "{{instance}} p50"),
           Q("histogram_quantile(0.99, sum by (le, instance) "
             f"(rate(sglang:e2e_request_latency_seconds_bucket{{{SGL}}}[$__rate_interval])))",
             "{{instance}} p99")], unit="s", extraction=False),
    ]),
]
