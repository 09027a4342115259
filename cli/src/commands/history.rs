//! `salus history`: the job history `learned` ranks by, and its erasure.

use clap::Subcommand;
use salus_proto::salus::v1::admin_client::AdminClient;
use salus_proto::salus::v1::{
    EraseHistoryRequest, HistoryIdentity, JobInfo, ListHistoryRequest, ListHistoryResponse,
};
use serde_json::{json, Value};
use tonic::transport::Channel;

use super::{pretty, table, CtlError};

#[derive(Subcommand, Debug)]
pub enum HistoryAction {
    /// Forget the history of a tenant's jobs (yours; an admin names one with --tenant).
    Erase,
}

pub async fn run(
    admin: &mut AdminClient<Channel>,
    action: Option<HistoryAction>,
    tenant: Option<String>,
    json: bool,
) -> Result<String, CtlError> {
    let tenant = tenant.unwrap_or_default();
    Ok(match action {
        Some(HistoryAction::Erase) => {
            let erased = admin
                .erase_history(EraseHistoryRequest {
                    tenant: tenant.clone(),
                })
                .await?
                .into_inner();
            let whose = if tenant.is_empty() {
                "your".to_string()
            } else {
                format!("tenant {tenant}'s")
            };
            if json {
                pretty(&json!({ "erased_identities": erased.identities }))
            } else {
                format!(
                    "erased {whose} job history: {} identities\n",
                    erased.identities
                )
            }
        }
        None => {
            let listed = admin
                .list_history(ListHistoryRequest { tenant })
                .await?
                .into_inner();
            if json {
                pretty(&history_json(&listed))
            } else {
                history_text(&listed)
            }
        }
    })
}

/// "12 min", "45 s", "3.2 h": a device time at a glance.
pub fn duration_text(seconds: f64) -> String {
    if seconds < 90.0 {
        format!("{seconds:.0} s")
    } else if seconds < 90.0 * 60.0 {
        format!("{:.0} min", seconds / 60.0)
    } else {
        format!("{:.1} h", seconds / 3600.0)
    }
}

/// A job row's history note: "expected 12 min from 7 earlier runs".
pub fn job_history_note(job: &JobInfo) -> Option<String> {
    (job.history_runs > 0).then(|| {
        format!(
            "expected {} from {} earlier run{}",
            duration_text(job.history_expected_seconds),
            job.history_runs,
            if job.history_runs == 1 { "" } else { "s" }
        )
    })
}

fn identity_json(i: &HistoryIdentity) -> Value {
    json!({
        "tenant": i.tenant,
        "name": i.name,
        "fingerprint": (!i.fingerprint.is_empty()).then_some(&i.fingerprint),
        "expected_s": (i.completed_runs > 0).then_some(i.expected_seconds),
        "sigma": (i.completed_runs > 0).then_some(i.sigma),
        "completed_runs": i.completed_runs,
        "runs": i.runs.iter().map(|r| json!({
            "device_s": r.device_seconds,
            "iterations": r.iterations,
            "end": r.end,
        })).collect::<Vec<_>>(),
    })
}

pub fn history_json(listed: &ListHistoryResponse) -> Value {
    json!({
        "identities": listed.identities.iter().map(identity_json).collect::<Vec<_>>(),
        "max_identities": listed.max_identities,
        "max_runs": listed.max_runs,
        "file": (!listed.file.is_empty()).then_some(&listed.file),
    })
}

pub fn history_text(listed: &ListHistoryResponse) -> String {
    let kept = if listed.file.is_empty() {
        "in memory only (no --state-dir)".to_string()
    } else {
        format!("kept in {}", listed.file)
    };
    if listed.identities.is_empty() {
        return format!("no job history ({kept})\n");
    }
    let rows: Vec<Vec<String>> = listed
        .identities
        .iter()
        .map(|i| {
            let last = i.runs.last();
            vec![
                if i.tenant.is_empty() {
                    "-".into()
                } else {
                    i.tenant.clone()
                },
                i.name.clone(),
                if i.fingerprint.is_empty() {
                    "-".into()
                } else {
                    i.fingerprint.clone()
                },
                i.runs.len().to_string(),
                i.completed_runs.to_string(),
                if i.completed_runs > 0 {
                    duration_text(i.expected_seconds)
                } else {
                    "-".into()
                },
                last.map_or("-".into(), |r| {
                    format!("{} ({})", duration_text(r.device_seconds), r.end)
                }),
            ]
        })
        .collect();
    table(
        &[
            "TENANT",
            "NAME",
            "FINGERPRINT",
            "RUNS",
            "COMPLETED",
            "EXPECTED",
            "LAST",
        ],
        &rows,
    ) + &format!(
        "{} identities ({kept}; at most {} identities of {} runs each)\n",
        listed.identities.len(),
        listed.max_identities,
        listed.max_runs
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use salus_proto::salus::v1::HistoryRun;

    fn listed() -> ListHistoryResponse {
        ListHistoryResponse {
            identities: vec![HistoryIdentity {
                tenant: "alice".into(),
                name: "train.py".into(),
                fingerprint: "g00000000000000ff".into(),
                runs: vec![
                    HistoryRun {
                        device_seconds: 700.0,
                        iterations: 70,
                        end: "completed".into(),
                    },
                    HistoryRun {
                        device_seconds: 30.0,
                        iterations: 3,
                        end: "failed".into(),
                    },
                ],
                expected_seconds: 700.0,
                sigma: 0.5,
                completed_runs: 1,
            }],
            max_identities: 4096,
            max_runs: 16,
            file: "/var/lib/salus/state/history.json".into(),
        }
    }

    #[test]
    fn the_history_renders_as_text_and_json() {
        let text = history_text(&listed());
        assert!(text.contains("train.py"), "{text}");
        assert!(text.contains("12 min"), "{text}");
        assert!(text.contains("30 s (failed)"), "{text}");
        assert!(
            text.contains("kept in /var/lib/salus/state/history.json"),
            "{text}"
        );
        let value = history_json(&listed());
        assert_eq!(value["identities"][0]["expected_s"], 700.0);
        assert_eq!(value["identities"][0]["runs"][1]["end"], "failed");
        let empty = history_text(&ListHistoryResponse::default());
        assert!(
            empty.starts_with("no job history (in memory only"),
            "{empty}"
        );
    }

    #[test]
    fn a_job_row_says_what_its_history_expects() {
        let mut job = JobInfo::default();
        assert_eq!(job_history_note(&job), None);
        job.history_runs = 7;
        job.history_expected_seconds = 720.0;
        assert_eq!(
            job_history_note(&job).as_deref(),
            Some("expected 12 min from 7 earlier runs")
        );
        job.history_runs = 1;
        job.history_expected_seconds = 5400.0;
        assert_eq!(
            job_history_note(&job).as_deref(),
            Some("expected 1.5 h from 1 earlier run")
        );
    }
}
