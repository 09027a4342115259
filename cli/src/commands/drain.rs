//! `salus drain`, `salus undrain` and `salus reload`.

use std::time::{Duration, Instant};

use salus_proto::salus::v1::admin_client::AdminClient;
use salus_proto::salus::v1::*;
use serde_json::{json, Value};
use tonic::transport::Channel;

use super::{job_json, jobs_table, pretty, CtlError};

/// How often `drain --wait` looks at the open jobs.
const WAIT_POLL: Duration = Duration::from_secs(1);

/// Drains the node; with `wait`, until no job is open (or `timeout`, given
/// as 90s, 15m, 2h: then an error listing the jobs still open).
pub async fn drain(
    admin: &mut AdminClient<Channel>,
    wait: bool,
    timeout: Option<Duration>,
    until_restart: bool,
    json: bool,
) -> Result<String, CtlError> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut status = admin
        .drain(DrainRequest { until_restart })
        .await?
        .into_inner();
    if wait {
        let mut said = None;
        while !status.jobs.is_empty() {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return Err(CtlError::StillRunning(format!(
                    "{} job(s) still open after --timeout {}s:\n{}",
                    status.jobs.len(),
                    timeout.unwrap_or_default().as_secs_f64(),
                    jobs_table(&status.jobs)
                )));
            }
            if said != Some(status.jobs.len()) {
                eprintln!(
                    "salus drain: waiting for {} open job(s) to end",
                    status.jobs.len()
                );
                said = Some(status.jobs.len());
            }
            tokio::time::sleep(left.map_or(WAIT_POLL, |l| l.min(WAIT_POLL))).await;
            // Polled without draining again: an undrain meanwhile ends the wait.
            let info = admin
                .get_server_info(GetServerInfoRequest {})
                .await?
                .into_inner();
            if !info.draining {
                return Err(CtlError::StillRunning(
                    "the node was undrained (salus undrain) while waiting".into(),
                ));
            }
            status.jobs = admin.list_jobs(ListJobsRequest {}).await?.into_inner().jobs;
        }
    }
    Ok(if json {
        pretty(&drain_json(&status))
    } else {
        drain_text(&status)
    })
}

pub async fn undrain(admin: &mut AdminClient<Channel>, json: bool) -> Result<String, CtlError> {
    let status = admin.undrain(UndrainRequest {}).await?.into_inner();
    Ok(if json {
        pretty(&drain_json(&status))
    } else {
        drain_text(&status)
    })
}

pub async fn reload(admin: &mut AdminClient<Channel>, json: bool) -> Result<String, CtlError> {
    let report = admin.reload(ReloadRequest {}).await?.into_inner();
    Ok(if json {
        pretty(&reload_json(&report))
    } else {
        reload_text(&report)
    })
}

pub fn drain_text(status: &DrainStatus) -> String {
    let mut out = if status.draining {
        format!(
            "draining since unix time {} (by {}): new jobs are refused with UNAVAILABLE until `salus undrain`{}\n",
            status.since_unix_seconds,
            status.by,
            if status.until_restart { " or the next start" } else { "" }
        )
    } else {
        "not draining: new jobs are admitted\n".to_string()
    };
    if status.jobs.is_empty() {
        out += "no job is open\n";
    } else {
        out += &format!("{} job(s) still open:\n", status.jobs.len());
        out += &jobs_table(&status.jobs);
    }
    out
}

pub fn drain_json(status: &DrainStatus) -> Value {
    json!({
        "draining": status.draining,
        "since_unix_s": if status.draining { status.since_unix_seconds.into() } else { Value::Null },
        "by": if status.draining { status.by.clone().into() } else { Value::Null },
        "until_restart": status.until_restart,
        "jobs": status.jobs.iter().map(job_json).collect::<Vec<_>>(),
    })
}

pub fn reload_text(report: &ReloadResponse) -> String {
    let file = |f: &str| {
        if f.is_empty() {
            "none".to_string()
        } else {
            f.to_string()
        }
    };
    let mut out = format!(
        "reloaded: config file {}, tenants file {}\n",
        file(&report.config_file),
        file(&report.tenants_file)
    );
    if report.applied.is_empty() && report.needs_restart.is_empty() {
        out += "nothing changed\n";
    }
    for line in &report.applied {
        out += &format!("applied: {line}\n");
    }
    for line in &report.needs_restart {
        out += &format!("not applied: {line}\n");
    }
    for line in &report.notes {
        out += &format!("note: {line}\n");
    }
    out
}

pub fn reload_json(report: &ReloadResponse) -> Value {
    let file = |f: &str| if f.is_empty() { Value::Null } else { f.into() };
    json!({
        "config_file": file(&report.config_file),
        "tenants_file": file(&report.tenants_file),
        "applied": report.applied,
        "needs_restart": report.needs_restart,
        "notes": report.notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_and_reload_render() {
        let status = DrainStatus {
            draining: true,
            since_unix_seconds: 1.7e9,
            by: "root (uid 0)".into(),
            until_restart: false,
            jobs: vec![JobInfo {
                id: 4,
                name: "train".into(),
                state: "running".into(),
                ..Default::default()
            }],
        };
        let text = drain_text(&status);
        assert!(
            text.starts_with("draining since unix time 1700000000 (by root (uid 0))"),
            "{text}"
        );
        assert!(text.contains("1 job(s) still open:\nID"), "{text}");
        assert!(text.contains("train"), "{text}");
        let v = drain_json(&status);
        assert_eq!(v["jobs"][0]["name"], "train");
        assert_eq!(v["by"], "root (uid 0)");
        let idle = DrainStatus::default();
        assert_eq!(
            drain_text(&idle),
            "not draining: new jobs are admitted\nno job is open\n"
        );
        assert_eq!(drain_json(&idle)["since_unix_s"], Value::Null);
        let report = ReloadResponse {
            config_file: "/etc/salus.toml".into(),
            applied: vec!["policy: fair -> srtf".into()],
            needs_restart: vec!["listen: a -> b (needs a restart)".into()],
            ..Default::default()
        };
        let text = reload_text(&report);
        assert!(
            text.contains("config file /etc/salus.toml, tenants file none"),
            "{text}"
        );
        assert!(
            text.contains("applied: policy: fair -> srtf\nnot applied: listen: a -> b"),
            "{text}"
        );
        assert_eq!(reload_json(&report)["tenants_file"], Value::Null);
        assert_eq!(
            reload_text(&ReloadResponse::default()).lines().nth(1),
            Some("nothing changed")
        );
    }
}
