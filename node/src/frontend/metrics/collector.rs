//! The `/metrics` view of the admin API: one scrape reads the same messages
//! `GetServerInfo`, `ListJobs` and `GetStats` answer (one set of counters, two
//! views) and encodes them with `prometheus-client` in Prometheus' text format.
//!
//! Job labels are bounded: the [`MAX_JOB_SERIES`] oldest open jobs (lowest ids)
//! get series of their own, labelled `job_id`, `job_name` and `kind`; younger
//! jobs are summed into `job_id="other"` of their kind. A job that has a series
//! keeps it while open (newer jobs never displace it); closed jobs' series end.

use std::collections::BTreeMap;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use salus_proto::salus::v1::{JobInfo, LatencySummary, SchedulerStats, ServerInfo, TenantShare};

/// Open jobs with series of their own; the rest are folded into "other".
pub const MAX_JOB_SERIES: usize = 100;

/// Histogram buckets exported: 2^0 .. 2^26 microseconds (1 us .. 67 s), the
/// admin API's power-of-two buckets, so both views count the same samples.
const EXPORTED_BUCKETS: usize = 27;

/// Job states as label values (the admin API's, with underscores).
const STATES: [&str; 4] = ["running", "queued", "idle", "waiting_for_memory"];
const KINDS: [&str; 2] = ["graph", "eager"];

/// What one scrape shows: the admin API's answers at one moment.
#[derive(Debug)]
pub struct Scrape {
    pub info: ServerInfo,
    pub jobs: Vec<JobInfo>,
    pub stats: SchedulerStats,
}

type Labels = Vec<(&'static str, String)>;

/// Per-job values of one series row (a job, or the jobs folded together).
#[derive(Default)]
struct JobRow {
    iterations: u64,
    cheap_runs: u64,
    runs_failed: u64,
    device_seconds: f64,
    queued: u64,
    persistent_bytes: u64,
    ephemeral_bytes: u64,
}

impl JobRow {
    fn add(&mut self, j: &JobInfo) {
        self.iterations += j.iterations;
        self.cheap_runs += j.cheap_runs;
        self.runs_failed += j.runs_failed;
        self.device_seconds += j.attained_seconds;
        self.queued += j.queued;
        self.persistent_bytes += j.persistent_estimate_bytes;
        self.ephemeral_bytes += j.ephemeral_estimate_bytes;
    }
}

/// The label value of a job's state or kind.
fn label_value(admin: &str) -> String {
    admin.replace(' ', "_")
}

/// Rows of per-job series, labels bounded as the module doc says.
fn job_rows(jobs: &[JobInfo]) -> Vec<(Labels, JobRow)> {
    let mut sorted: Vec<&JobInfo> = jobs.iter().collect();
    sorted.sort_by_key(|j| j.id);
    let mut rows = Vec::new();
    let mut other: BTreeMap<String, JobRow> = BTreeMap::new();
    for (n, job) in sorted.into_iter().enumerate() {
        let kind = label_value(&job.kind);
        if n < MAX_JOB_SERIES {
            let mut row = JobRow::default();
            row.add(job);
            let labels = vec![
                ("job_id", job.id.to_string()),
                ("job_name", job.name.clone()),
                ("kind", kind),
            ];
            rows.push((labels, row));
        } else {
            other.entry(kind).or_default().add(job);
        }
    }
    rows.extend(other.into_iter().map(|(kind, row)| {
        (
            vec![
                ("job_id", "other".to_string()),
                ("job_name", "other".to_string()),
                ("kind", kind),
            ],
            row,
        )
    }));
    rows
}

/// Cumulative-ready (per bucket) histogram buckets in seconds from the admin
/// API's power-of-two microsecond buckets: bucket i holds samples below 2^i us.
fn seconds_buckets(l: &LatencySummary) -> Vec<(f64, u64)> {
    (0..EXPORTED_BUCKETS)
        .map(|i| {
            (
                (1u64 << i) as f64 * 1e-6,
                l.buckets.get(i).copied().unwrap_or(0),
            )
        })
        .collect()
}

fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> std::fmt::Result {
    ConstCounter::new(value).encode(enc.encode_descriptor(name, help, None, MetricType::Counter)?)
}

fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, value: f64) -> std::fmt::Result {
    ConstGauge::new(value).encode(enc.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

fn gauges(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Labels, f64)],
) -> std::fmt::Result {
    let mut family = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in rows {
        ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

fn counters(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Labels, f64)],
) -> std::fmt::Result {
    let mut family = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in rows {
        ConstCounter::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

fn histogram(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    l: Option<&LatencySummary>,
) -> std::fmt::Result {
    let empty = LatencySummary::default();
    let l = l.unwrap_or(&empty);
    let mut metric = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
    metric.encode_histogram::<NoLabelSet>(l.sum_us / 1e6, l.count, &seconds_buckets(l), None)
}

impl Scrape {
    fn encode_server(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let info = &self.info;
        gauges(
            enc,
            "salus_server_info",
            "Always 1: the server's version, TensorFlow version and scheduling policy.",
            &[(
                vec![
                    ("version", info.version.clone()),
                    ("tensorflow_version", info.tensorflow_version.clone()),
                    ("policy", info.policy.clone()),
                ],
                1.0,
            )],
        )?;
        gauge(
            enc,
            "salus_uptime_seconds",
            "Seconds since the server started.",
            info.uptime_seconds,
        )?;
        gauge(
            enc,
            "salus_heap_in_use_bytes",
            "Bytes of the server's heap in live blocks (mallinfo2).",
            info.heap_in_use_bytes as f64,
        )?;
        counter(
            enc,
            "salus_sessions_created",
            "Graph sessions created since start.",
            info.sessions_created,
        )?;
        counters(
            enc,
            "salus_jobs_reclaimed",
            "Jobs closed because their client vanished (idle, or an eager client's streams ended), by kind.",
            &[
                (vec![("kind", "graph".into())], info.sessions_reclaimed as f64),
                (vec![("kind", "eager".into())], info.eager_contexts_reclaimed as f64),
            ],
        )?;
        counters(
            enc,
            "salus_executors",
            "Tenants' executor processes (--isolation tenant) started since start, and ended other than by being \
             stopped (crashed, killed, failed to start).",
            &[
                (vec![("event", "started".into())], info.executors_started as f64),
                (vec![("event", "failed".into())], info.executors_failed as f64),
            ],
        )?;
        gauge(
            enc,
            "salus_executors_running",
            "Tenants' executor processes running now.",
            info.executors_running as f64,
        )?;
        let errors: Vec<(Labels, f64)> = info
            .run_errors
            .iter()
            .map(|e| (vec![("code", e.code.clone())], e.count as f64))
            .collect();
        counters(
            enc,
            "salus_run_errors",
            "Failed graph runs and eager requests by TensorFlow error code.",
            &errors,
        )?;
        counter(
            enc,
            "salus_admission_waits",
            "Memory admission requests that had to wait for memory.",
            info.admission_waits,
        )?;
        counter(
            enc,
            "salus_admission_refusals",
            "Memory admission requests refused at once: the job is larger than the device or its lane.",
            info.admission_refusals,
        )?;
        counter(
            enc,
            "salus_admission_timeouts",
            "Memory admission requests that waited longer than --admission-timeout.",
            info.admission_timeouts,
        )?;
        if info.memory_capacity_bytes > 0 {
            gauge(
                enc,
                "salus_memory_capacity_bytes",
                "Memory the jobs share (admission on).",
                info.memory_capacity_bytes as f64,
            )?;
            gauge(
                enc,
                "salus_memory_free_bytes",
                "Capacity not held by admitted jobs (admission on).",
                info.memory_free_bytes as f64,
            )?;
        }
        let lane = |l: u32| vec![("lane", l.to_string())];
        let lanes = &info.memory_lanes;
        let rows = |f: &dyn Fn(&salus_proto::salus::v1::MemoryLane) -> f64| -> Vec<(Labels, f64)> {
            lanes.iter().map(|l| (lane(l.lane), f(l))).collect()
        };
        gauges(
            enc,
            "salus_lane_capacity_bytes",
            "A memory lane's size.",
            &rows(&|l| l.size_bytes as f64),
        )?;
        gauges(
            enc,
            "salus_lane_used_bytes",
            "A memory lane's use: its jobs' persistent memory plus the largest ephemeral need.",
            &rows(&|l| l.used_bytes as f64),
        )?;
        gauges(
            enc,
            "salus_lane_jobs",
            "Jobs admitted to a memory lane.",
            &rows(&|l| l.jobs.len() as f64),
        )?;
        Ok(())
    }

    fn encode_scheduler(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let s = &self.stats;
        counter(
            enc,
            "salus_iterations",
            "Main iterations finished (scheduled on lanes).",
            s.iterations_total,
        )?;
        counter(
            enc,
            "salus_cheap_runs",
            "Runs and function calls that bypassed the scheduler as cheap.",
            s.cheap_runs_total,
        )?;
        counter(
            enc,
            "salus_dropped_iterations",
            "Queued iterations dropped without running (client gone, deadline passed, job closed).",
            s.dropped_iterations,
        )?;
        counter(
            enc,
            "salus_lane_holds_released",
            "Main iterations that held their lane past --lane-hold-limit and ran on beside other jobs' iterations.",
            s.lane_holds_released,
        )?;
        gauge(
            enc,
            "salus_queued_iterations",
            "Main iterations waiting for their lane.",
            s.queued as f64,
        )?;
        let lane = |l: u32| vec![("lane", l.to_string())];
        let queued: Vec<(Labels, f64)> = s
            .lanes
            .iter()
            .map(|l| (lane(l.lane), l.queued as f64))
            .collect();
        let running: Vec<(Labels, f64)> = s
            .lanes
            .iter()
            .map(|l| (lane(l.lane), l.running as f64))
            .collect();
        gauges(
            enc,
            "salus_lane_queued_iterations",
            "Main iterations waiting, per scheduler lane.",
            &queued,
        )?;
        gauges(
            enc,
            "salus_lane_running_iterations",
            "Main iterations running, per scheduler lane.",
            &running,
        )?;
        histogram(
            enc,
            "salus_switch_latency_seconds",
            "Time from one job's iteration end to another job's iteration start on a lane, when the other was waiting.",
            s.switch_latency.as_ref(),
        )?;
        histogram(
            enc,
            "salus_iteration_duration_seconds",
            "Device time of main iterations.",
            s.iteration_time.as_ref(),
        )?;
        histogram(
            enc,
            "salus_queue_wait_seconds",
            "Time main iterations waited from submission to dispatch.",
            s.queue_wait.as_ref(),
        )?;
        self.encode_tenants(enc)
    }

    /// Per tenant (bounded by the tenants the server knows: users and the
    /// tenants file's names).
    fn encode_tenants(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let rows = |f: fn(&TenantShare) -> f64| -> Vec<(Labels, f64)> {
            self.stats
                .tenants
                .iter()
                .map(|t| (vec![("tenant", t.tenant.clone())], f(t)))
                .collect()
        };
        counters(
            enc,
            "salus_tenant_device_seconds",
            "Device time of a tenant's jobs (main iterations and brief runs) since the server started.",
            &rows(|t| t.device_seconds),
        )?;
        counters(
            enc,
            "salus_tenant_refusals",
            "A tenant's jobs and memory requests refused (max-jobs, memory share, too large, admission timed out).",
            &rows(|t| t.refusals as f64),
        )?;
        gauges(
            enc,
            "salus_tenant_jobs",
            "Open jobs per tenant.",
            &rows(|t| t.jobs as f64),
        )?;
        gauges(
            enc,
            "salus_tenant_queued_iterations",
            "Iterations queued or running per tenant.",
            &rows(|t| t.queued as f64),
        )?;
        gauges(
            enc,
            "salus_tenant_memory_bytes",
            "Device memory a tenant's jobs hold admitted or wait for (--memory-capacity).",
            &rows(|t| t.memory_bytes as f64),
        )?;
        gauges(
            enc,
            "salus_tenant_weight",
            "A tenant's weight in sharing device time between tenants (--share tenants).",
            &rows(|t| t.weight as f64),
        )
    }

    fn encode_jobs(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let mut by_state: Vec<(Labels, f64)> = Vec::new();
        for kind in KINDS {
            for state in STATES {
                let count = self
                    .jobs
                    .iter()
                    .filter(|j| label_value(&j.kind) == kind && label_value(&j.state) == state)
                    .count();
                by_state.push((
                    vec![("state", state.into()), ("kind", kind.into())],
                    count as f64,
                ));
            }
        }
        gauges(
            enc,
            "salus_jobs",
            "Open jobs by state and kind (graph: TF1 session, eager: TF2 context).",
            &by_state,
        )?;
        let rows = job_rows(&self.jobs);
        let column = |f: &dyn Fn(&JobRow) -> f64| -> Vec<(Labels, f64)> {
            rows.iter()
                .map(|(labels, row)| (labels.clone(), f(row)))
                .collect()
        };
        counters(
            enc,
            "salus_job_iterations",
            "Main iterations a job finished.",
            &column(&|r| r.iterations as f64),
        )?;
        counters(
            enc,
            "salus_job_cheap_runs",
            "A job's cheap runs (bypassing the scheduler).",
            &column(&|r| r.cheap_runs as f64),
        )?;
        counters(
            enc,
            "salus_job_runs_failed",
            "A job's failed runs or eager requests.",
            &column(&|r| r.runs_failed as f64),
        )?;
        counters(
            enc,
            "salus_job_device_seconds",
            "Device time of a job's main iterations.",
            &column(&|r| r.device_seconds),
        )?;
        gauges(
            enc,
            "salus_job_queued_iterations",
            "A job's main iterations waiting.",
            &column(&|r| r.queued as f64),
        )?;
        gauges(
            enc,
            "salus_job_persistent_estimate_bytes",
            "A job's persistent memory estimate (variables, +10% margin).",
            &column(&|r| r.persistent_bytes as f64),
        )?;
        gauges(
            enc,
            "salus_job_ephemeral_estimate_bytes",
            "A job's per-iteration memory estimate (+5% margin).",
            &column(&|r| r.ephemeral_bytes as f64),
        )
    }
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        self.encode_server(&mut encoder)?;
        self.encode_scheduler(&mut encoder)?;
        self.encode_jobs(&mut encoder)
    }
}

/// The scrape in Prometheus' text format (0.0.4).
pub fn encode(scrape: Scrape) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(scrape));
    let mut text = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use salus_proto::salus::v1::{ErrorCount, LaneQueue, MemoryLane};

    fn job(id: u64, name: &str, kind: &str, state: &str, iterations: u64) -> JobInfo {
        JobInfo {
            id,
            name: name.into(),
            kind: kind.into(),
            state: state.into(),
            iterations,
            cheap_runs: 2,
            persistent_estimate_bytes: 1000,
            ephemeral_estimate_bytes: 10,
            ..Default::default()
        }
    }

    /// The value of the sample whose line starts with `series` (name and labels).
    fn value(text: &str, series: &str) -> f64 {
        let line = text
            .lines()
            .find(|l| {
                l.strip_prefix(series)
                    .is_some_and(|rest| rest.starts_with(' '))
            })
            .unwrap_or_else(|| panic!("no sample {series} in\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }

    fn scrape(jobs: Vec<JobInfo>) -> String {
        let latency = LatencySummary {
            count: 3,
            sum_us: 7.5,
            // one sample below 1 us, two in [2, 4) us
            buckets: vec![1, 0, 2],
            ..Default::default()
        };
        encode(Scrape {
            info: ServerInfo {
                version: "0.1.0".into(),
                tensorflow_version: "2.21.0".into(),
                policy: "pack".into(),
                memory_capacity_bytes: 4096,
                memory_free_bytes: 1024,
                memory_lanes: vec![MemoryLane {
                    lane: 3,
                    size_bytes: 3072,
                    used_bytes: 2000,
                    jobs: vec![1, 2],
                }],
                admission_waits: 4,
                run_errors: vec![ErrorCount {
                    code: "RESOURCE_EXHAUSTED".into(),
                    count: 5,
                }],
                eager_contexts_reclaimed: 6,
                ..Default::default()
            },
            jobs,
            stats: SchedulerStats {
                iterations_total: 42,
                lanes: vec![LaneQueue {
                    lane: 3,
                    queued: 1,
                    running: 1,
                }],
                switch_latency: Some(latency),
                tenants: vec![TenantShare {
                    tenant: "alice (uid 1001)".into(),
                    tenant_name: "alice".into(),
                    tenant_uid: Some(1001),
                    weight: 2,
                    device_seconds: 1.5,
                    jobs: 3,
                    queued: 1,
                    limits: None,
                    memory_bytes: 4096,
                    refusals: 5,
                }],
                ..Default::default()
            },
        })
        .unwrap()
    }

    #[test]
    fn encodes_server_scheduler_and_job_series() {
        let text = scrape(vec![
            job(1, "resnet", "graph", "running", 7),
            job(2, "bert \"big\"", "eager", "waiting for memory", 0),
        ]);
        assert!(
            text.contains("# TYPE salus_iterations_total counter\n"),
            "{text}"
        );
        assert_eq!(value(&text, "salus_iterations_total"), 42.0);
        assert_eq!(
            value(
                &text,
                r#"salus_server_info{version="0.1.0",tensorflow_version="2.21.0",policy="pack"}"#
            ),
            1.0
        );
        assert_eq!(
            value(&text, r#"salus_jobs{state="running",kind="graph"}"#),
            1.0
        );
        assert_eq!(
            value(
                &text,
                r#"salus_jobs{state="waiting_for_memory",kind="eager"}"#
            ),
            1.0
        );
        assert_eq!(
            value(&text, r#"salus_jobs{state="idle",kind="eager"}"#),
            0.0
        );
        assert_eq!(
            value(
                &text,
                r#"salus_job_iterations_total{job_id="1",job_name="resnet",kind="graph"}"#
            ),
            7.0
        );
        // Label values are escaped.
        assert_eq!(
            value(
                &text,
                r#"salus_job_cheap_runs_total{job_id="2",job_name="bert \"big\"",kind="eager"}"#
            ),
            2.0
        );
        assert_eq!(value(&text, r#"salus_lane_used_bytes{lane="3"}"#), 2000.0);
        assert_eq!(value(&text, r#"salus_lane_jobs{lane="3"}"#), 2.0);
        assert_eq!(
            value(&text, r#"salus_lane_running_iterations{lane="3"}"#),
            1.0
        );
        assert_eq!(value(&text, "salus_memory_free_bytes"), 1024.0);
        assert_eq!(value(&text, "salus_admission_waits_total"), 4.0);
        assert_eq!(
            value(
                &text,
                r#"salus_run_errors_total{code="RESOURCE_EXHAUSTED"}"#
            ),
            5.0
        );
        assert_eq!(
            value(&text, r#"salus_jobs_reclaimed_total{kind="eager"}"#),
            6.0
        );
        assert_eq!(
            value(
                &text,
                r#"salus_tenant_device_seconds_total{tenant="alice (uid 1001)"}"#
            ),
            1.5
        );
        assert_eq!(
            value(&text, r#"salus_tenant_jobs{tenant="alice (uid 1001)"}"#),
            3.0
        );
        assert_eq!(
            value(&text, r#"salus_tenant_weight{tenant="alice (uid 1001)"}"#),
            2.0
        );
        assert_eq!(
            value(
                &text,
                r#"salus_tenant_memory_bytes{tenant="alice (uid 1001)"}"#
            ),
            4096.0
        );
        assert_eq!(
            value(
                &text,
                r#"salus_tenant_refusals_total{tenant="alice (uid 1001)"}"#
            ),
            5.0
        );
    }

    #[test]
    fn histograms_are_cumulative_in_seconds() {
        let text = scrape(vec![]);
        assert!(
            text.contains("# TYPE salus_switch_latency_seconds histogram\n"),
            "{text}"
        );
        assert_eq!(
            value(&text, r#"salus_switch_latency_seconds_bucket{le="1e-06"}"#),
            1.0
        );
        assert_eq!(
            value(&text, r#"salus_switch_latency_seconds_bucket{le="2e-06"}"#),
            1.0
        );
        assert_eq!(
            value(&text, r#"salus_switch_latency_seconds_bucket{le="4e-06"}"#),
            3.0
        );
        assert_eq!(
            value(&text, r#"salus_switch_latency_seconds_bucket{le="+Inf"}"#),
            3.0
        );
        assert_eq!(value(&text, "salus_switch_latency_seconds_count"), 3.0);
        assert_eq!(value(&text, "salus_switch_latency_seconds_sum"), 7.5e-6);
        // Histograms with no samples yet still have every bucket.
        assert_eq!(
            value(&text, r#"salus_queue_wait_seconds_bucket{le="+Inf"}"#),
            0.0
        );
        let buckets = text
            .lines()
            .filter(|l| l.starts_with("salus_queue_wait_seconds_bucket"))
            .count();
        assert_eq!(buckets, EXPORTED_BUCKETS + 1);
    }

    #[test]
    fn job_series_are_capped_and_the_rest_folded_per_kind() {
        let jobs: Vec<JobInfo> = (1..=MAX_JOB_SERIES as u64 + 5)
            .map(|id| {
                job(
                    id,
                    "same-name",
                    if id % 2 == 0 { "eager" } else { "graph" },
                    "idle",
                    id,
                )
            })
            .collect();
        let text = scrape(jobs);
        let own = text
            .lines()
            .filter(|l| {
                l.starts_with("salus_job_iterations_total{") && !l.contains(r#"job_id="other""#)
            })
            .count();
        assert_eq!(own, MAX_JOB_SERIES);
        // Jobs 101..=105 fold: 101, 103, 105 are graph jobs, 102, 104 eager.
        assert_eq!(
            value(
                &text,
                r#"salus_job_iterations_total{job_id="other",job_name="other",kind="graph"}"#
            ),
            (101 + 103 + 105) as f64
        );
        assert_eq!(
            value(
                &text,
                r#"salus_job_persistent_estimate_bytes{job_id="other",job_name="other",kind="eager"}"#
            ),
            2000.0
        );
        assert_eq!(
            value(
                &text,
                r#"salus_job_iterations_total{job_id="100",job_name="same-name",kind="eager"}"#
            ),
            100.0
        );
    }
}
