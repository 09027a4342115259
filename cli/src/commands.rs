//! The commands that call the admin API: each one's calls, and its output as
//! text or (`--json`) JSON.

mod capacity;
mod drain;
mod history;
mod info;
mod jobs;
mod stats;
mod tokens;

use clap::{Args, Subcommand};
use salus_proto::salus::v1::admin_client::AdminClient;
use salus_proto::salus::v1::*;
use serde_json::{json, Value};
use tonic::transport::Channel;

pub use crate::error::CliError as CtlError;
use crate::{Command, Connection, PolicyAction};
use capacity::*;
pub use history::HistoryAction;
pub use info::{info_json, info_text};
pub use jobs::*;
pub use stats::*;
use tokens::*;

/// A tenant's limits on the command line (unset: unchanged).
#[derive(Args, Debug, Clone)]
pub struct LimitArgs {
    /// Its share of device time against other tenants' (1 to 1000; default 1).
    #[arg(long)]
    weight: Option<u32>,
    /// Jobs (sessions and eager contexts) it may have open at once.
    #[arg(long)]
    max_jobs: Option<u32>,
    /// The highest priority hint its jobs may claim (higher ones are lowered).
    #[arg(long, allow_negative_numbers = true)]
    max_priority: Option<i32>,
    /// Device memory its jobs may hold admitted or waiting at once (4GiB; with
    /// --memory-capacity). On a token, also a reservation: held for the
    /// tenant's jobs, out of other tenants' reach, while the token is valid.
    #[arg(long, value_parser = salus_sched::units::parse_size)]
    memory: Option<u64>,
}

impl LimitArgs {
    fn to_proto(&self) -> TenantLimits {
        TenantLimits {
            weight: self.weight,
            max_jobs: self.max_jobs,
            max_priority: self.max_priority,
            memory_bytes: self.memory,
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum TokenAction {
    /// Print a new token for a tenant (the server keeps only its hash, in memory and in its --state-dir).
    Issue {
        /// The tenant it identifies (letters, digits, - _ . @).
        #[arg(long)]
        tenant: String,
        /// Bind it to a Unix user (a uid or a user name): accepted only from
        /// that user on loopback; the tenant is then that user.
        #[arg(long)]
        uid: Option<String>,
        /// Limits for the tenant while the token is valid (several valid tokens
        /// of one tenant add up their memory and jobs).
        #[command(flatten)]
        limits: LimitArgs,
        /// Lifetime: 90s, 15m, 2h, 7d (a bare number is seconds); default: until revoked.
        #[arg(long, value_name = "DURATION", value_parser = crate::units::parse_duration)]
        expires: Option<std::time::Duration>,
        /// Print the token and its record as JSON instead of the token alone.
        #[arg(long)]
        json: bool,
    },
    /// Revoke the token with an id (--id ID, or ID alone), or every token of
    /// a tenant (--tenant NAME). An id is never taken for a tenant's name.
    #[command(group(clap::ArgGroup::new("which").required(true).args(["id", "id_flag", "tenant"])))]
    Revoke {
        /// The token's id (as --id).
        id: Option<String>,
        /// The token's id.
        #[arg(long = "id", value_name = "ID")]
        id_flag: Option<String>,
        /// Every token of the tenant of this name.
        #[arg(long, value_name = "NAME")]
        tenant: Option<String>,
        /// The revoked tokens' records as a JSON array (the keys of `token list --json`).
        #[arg(long)]
        json: bool,
    },
    /// The tokens issued and valid: id, tenant, user, limits, expiry (never the tokens).
    List {
        /// As a JSON array of token records (keys: docs/src/reference/json.md).
        #[arg(long)]
        json: bool,
    },
}

/// Why `token` cannot travel in a user-agent word (never quoting it).
fn token_problem(token: &str) -> Option<&'static str> {
    if token.is_empty() {
        return Some("is empty");
    }
    if token.len() > 256 {
        return Some("is longer than 256 characters");
    }
    if token
        .chars()
        .any(|c| !c.is_ascii_graphic() || matches!(c, ',' | '=' | '"' | '\\'))
    {
        return Some("contains a space, a control or non-ASCII character, or one of , = \" \\");
    }
    None
}

/// The URL of `server` (HOST:PORT or grpc://HOST:PORT), or a usage error.
pub fn server_url(server: &str) -> Result<String, CtlError> {
    let bad = || {
        CtlError::Usage(format!(
            "--server (or SALUS_SERVER) {server:?} is not valid: expected HOST:PORT or grpc://HOST:PORT, e.g. 127.0.0.1:5501"
        ))
    };
    let rest = match server.split_once("://") {
        Some(("grpc", rest)) => rest,
        Some(_) => return Err(bad()),
        None => server,
    };
    let rest = rest.trim_end_matches('/');
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || host.contains('/') || !matches!(port.parse::<u16>(), Ok(p) if p > 0) {
        return Err(bad());
    }
    Ok(format!("http://{rest}"))
}

/// A client of the admin API at `conn.server`, identified by `conn.token`.
pub async fn connect(conn: &Connection) -> Result<AdminClient<Channel>, CtlError> {
    let url = server_url(&conn.server)?;
    let mut endpoint = Channel::from_shared(url).map_err(|_| {
        CtlError::Usage(format!("--server {:?} is not a valid address", conn.server))
    })?;
    endpoint = endpoint.connect_timeout(conn.connect_timeout);
    if let Some(token) = conn.token.as_deref() {
        if let Some(problem) = token_problem(token) {
            return Err(CtlError::Usage(format!(
                "the token (--token or SALUS_TOKEN) {problem}"
            )));
        }
        // Where the server looks for it, as the adapters put it: a `salus1.TOKEN` word.
        endpoint = endpoint
            .user_agent(format!("salus1.{token}"))
            .map_err(|_| CtlError::Usage("the token cannot be sent in a header".into()))?;
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|source| CtlError::Unreachable {
            addr: conn.server.clone(),
            source: Box::new(source),
        })?;
    Ok(AdminClient::new(channel))
}

/// Runs one command of the admin API and returns what to print.
pub async fn run(conn: &Connection, command: Command) -> Result<String, CtlError> {
    let mut admin = connect(conn).await?;
    Ok(match command {
        Command::Jobs { out } => {
            let listed = admin.list_jobs(ListJobsRequest {}).await?.into_inner();
            if out.json {
                pretty(&jobs_json(&listed))
            } else {
                jobs_table(&listed.jobs) + &reservations_text(&listed.reservations)
            }
        }
        Command::Limits {
            tenant,
            limits,
            out,
        } => {
            let now = admin
                .set_tenant_limits(SetTenantLimitsRequest {
                    tenant: tenant.clone(),
                    limits: Some(limits.to_proto()),
                })
                .await?
                .into_inner();
            if out.json {
                pretty(&limits_json(&tenant, &now))
            } else {
                format!("limits of {tenant}: {}\n", limits_text(Some(&now)))
            }
        }
        Command::Token { action } => token(&mut admin, action).await?,
        Command::Drain {
            wait,
            timeout,
            until_restart,
            out,
        } => drain::drain(&mut admin, wait, timeout, until_restart, out.json).await?,
        Command::Undrain { out } => drain::undrain(&mut admin, out.json).await?,
        Command::Reload { out } => drain::reload(&mut admin, out.json).await?,
        Command::History {
            action,
            tenant,
            json,
        } => history::run(&mut admin, action, tenant, json).await?,
        Command::Info { out } => {
            let info = admin
                .get_server_info(GetServerInfoRequest {})
                .await?
                .into_inner();
            if out.json {
                pretty(&info::info_json(&info))
            } else {
                info::info_text(&info)
            }
        }
        Command::Capacity { out } => {
            let info = admin
                .get_server_info(GetServerInfoRequest {})
                .await?
                .into_inner();
            if info.memory_capacity_bytes == 0 {
                return Err(CtlError::NoCapacity);
            }
            if out.json {
                pretty(&capacity_json(&info))
            } else {
                capacity_text(&info)
            }
        }
        Command::Stats { out } => {
            let stats = admin.get_stats(GetStatsRequest {}).await?.into_inner();
            let info = admin
                .get_server_info(GetServerInfoRequest {})
                .await?
                .into_inner();
            if out.json {
                let mut value = stats_json(&stats);
                value["server_counters"] = counters_json(&info);
                pretty(&value)
            } else {
                stats_text(&stats) + &counters_text(&info)
            }
        }
        Command::Policy {
            action: None | Some(PolicyAction::Show),
            json,
        } => {
            let policy = admin
                .get_server_info(GetServerInfoRequest {})
                .await?
                .into_inner()
                .policy;
            if json {
                pretty(&json!({ "policy": policy }))
            } else {
                format!("policy: {policy}\n")
            }
        }
        Command::Policy {
            action: Some(PolicyAction::Set { name }),
            json,
        } => {
            let r = admin
                .set_policy(SetPolicyRequest { policy: name })
                .await?
                .into_inner();
            if json {
                pretty(&json!({ "previous": r.previous, "policy": r.policy }))
            } else {
                format!("policy: {} -> {}\n", r.previous, r.policy)
            }
        }
        Command::Hints {
            job,
            priority,
            iterations,
            seconds,
            out,
        } => {
            if let Some(s) = seconds {
                if !(s.is_finite() && s >= 0.0) {
                    return Err(CtlError::Usage(format!(
                        "--seconds {s}: expected a finite number >= 0 (0: none)"
                    )));
                }
            }
            // Only the fields given travel: the server keeps the others.
            let hints = Some(JobHintsUpdate {
                priority,
                expected_iterations: iterations,
                expected_seconds: seconds,
            });
            let info = admin
                .set_job_hints(SetJobHintsRequest { job, hints })
                .await?
                .into_inner();
            if out.json {
                pretty(&job_json(&info))
            } else {
                jobs_table(&[info])
            }
        }
        Command::Timeline { seconds, png, out } => {
            let seconds = seconds.as_secs_f64();
            let timeline = admin
                .get_timeline(GetTimelineRequest { seconds })
                .await?
                .into_inner();
            let value = timeline_json(&timeline, seconds);
            if let Some(path) = png {
                crate::timeline_png::draw_timeline_png(&value, &path)?
            } else if out.json {
                pretty(&value)
            } else {
                timeline_text(&timeline, seconds)
            }
        }
        Command::Run(_)
        | Command::Top(_)
        | Command::Completions { .. }
        | Command::Manpages { .. } => {
            return Err(CtlError::Local(
                "run, top, completions and manpages are not admin API calls".into(),
            ))
        }
    })
}

/// `limits --json`: the limits that now apply to the tenant (null: none of its own).
pub fn limits_json(tenant: &str, l: &TenantLimits) -> Value {
    json!({
        "tenant": tenant,
        "weight": l.weight,
        "max_jobs": l.max_jobs,
        "max_priority": l.max_priority,
        "memory_bytes": l.memory_bytes,
    })
}

fn pretty(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_else(|_| "null".into());
    text.push('\n');
    text
}

/// A table cell: the text, or "-" for none.
pub(crate) fn or_dash(text: &str) -> String {
    if text.is_empty() {
        "-".into()
    } else {
        text.into()
    }
}

fn opt<T: PartialEq + Default + Into<Value>>(v: T) -> Value {
    if v == T::default() {
        Value::Null
    } else {
        v.into()
    }
}

/// Left-aligned columns separated by two spaces.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut out: String = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ");
        out.truncate(out.trim_end().len());
        out.push('\n');
        out
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        out += &line(row.clone());
    }
    out
}

async fn token(admin: &mut AdminClient<Channel>, action: TokenAction) -> Result<String, CtlError> {
    Ok(match action {
        TokenAction::Issue {
            tenant,
            uid,
            limits,
            expires,
            json,
        } => {
            let uid = uid.map(|u| resolve_uid(&u)).transpose()?;
            let expires_seconds = expires.map_or(0.0, |e| e.as_secs_f64());
            let issued = admin
                .issue_token(IssueTokenRequest {
                    tenant,
                    uid,
                    limits: Some(limits.to_proto()),
                    expires_seconds,
                })
                .await?
                .into_inner();
            if json {
                let mut value = token_json(&issued.info.unwrap_or_default());
                value["token"] = json!(issued.token);
                pretty(&value)
            } else {
                format!("{}\n", issued.token)
            }
        }
        TokenAction::Revoke {
            id,
            id_flag,
            tenant,
            json,
        } => {
            let revoked = admin
                .revoke_tokens(RevokeTokensRequest {
                    which: String::new(),
                    id: id.or(id_flag).unwrap_or_default(),
                    tenant: tenant.unwrap_or_default(),
                })
                .await?
                .into_inner()
                .tokens;
            if json {
                pretty(&Value::Array(revoked.iter().map(token_json).collect()))
            } else {
                revoked
                    .iter()
                    .map(|t| format!("revoked {} (tenant {})\n", t.id, t.tenant))
                    .collect()
            }
        }
        TokenAction::List { json } => {
            let tokens = admin
                .list_tokens(ListTokensRequest {})
                .await?
                .into_inner()
                .tokens;
            if json {
                pretty(&Value::Array(tokens.iter().map(token_json).collect()))
            } else {
                tokens_table(&tokens)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> JobInfo {
        JobInfo {
            id: 3,
            kind: "eager".into(),
            name: "resnet".into(),
            state: "queued".into(),
            iterations: 12,
            attained_seconds: 1.5,
            hints: Some(JobHints {
                priority: 2,
                expected_iterations: 100,
                expected_seconds: 0.0,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn jobs_render_as_table_and_json() {
        let text = jobs_table(&[job()]);
        let mut lines = text.lines();
        assert!(lines
            .next()
            .unwrap()
            .starts_with("ID  KIND   NAME    TENANT  STATE"));
        let row = lines.next().unwrap();
        assert!(
            row.starts_with("3   eager  resnet  -       queued"),
            "{row}"
        );
        assert!(row.contains("100 it"), "{row}");
        assert_eq!(jobs_table(&[]), "no jobs\n");
        let v = job_json(&job());
        assert_eq!(v["iterations"], 12);
        assert_eq!(v["kind"], "eager");
        assert_eq!(v["expected_iterations"], 100);
        assert_eq!(v["expected_seconds"], Value::Null);
        assert_eq!(v["priority"], 2);
        assert_eq!(v["lane"], 0);
        assert_eq!(
            jobs_table(&[job()])
                .lines()
                .nth(1)
                .unwrap()
                .split_whitespace()
                .nth(5),
            Some("0")
        );
        let waiting = JobInfo {
            memory_state: "waiting for memory".into(),
            ..job()
        };
        assert_eq!(job_json(&waiting)["lane"], Value::Null);
        // The table says "-" for no lane, not 0.
        let row = jobs_table(&[waiting]);
        let row = row.lines().nth(1).unwrap();
        assert_eq!(row.split_whitespace().nth(5), Some("-"), "{row}");
    }

    /// `salus jobs --json` carries what the text form shows: the reservations
    /// too, and each tenant as its bare name and uid apart, never the label.
    #[test]
    fn jobs_json_has_reservations_and_bare_tenants() {
        let owned = JobInfo {
            tenant: "salush1 (uid 1001)".into(),
            tenant_name: "salush1".into(),
            tenant_uid: Some(1001),
            ..job()
        };
        let by_token = JobInfo {
            id: 4,
            tenant: "bot1".into(),
            tenant_name: "bot1".into(),
            ..job()
        };
        let reservation = Reservation {
            tenant: "salush1 (uid 1001)".into(),
            tenant_name: "salush1".into(),
            tenant_uid: Some(1001),
            reserved_bytes: 1 << 30,
            claimed_bytes: 1 << 20,
            token_ids: vec!["0123456789ab".into()],
            expires_unix_seconds: 0.0,
            jobs_started: 2,
        };
        let listed = ListJobsResponse {
            jobs: vec![owned, by_token],
            reservations: vec![reservation.clone()],
        };
        let v = jobs_json(&listed);
        assert_eq!(v["jobs"][0]["tenant"], "salush1");
        assert_eq!(v["jobs"][0]["uid"], 1001);
        assert_eq!(v["jobs"][1]["tenant"], "bot1");
        assert_eq!(v["jobs"][1]["uid"], Value::Null);
        let r = &v["reservations"][0];
        assert_eq!(r["tenant"], "salush1");
        assert_eq!(r["uid"], 1001);
        assert_eq!(r["reserved_bytes"], 1u64 << 30);
        assert_eq!(r["claimed_bytes"], 1u64 << 20);
        assert_eq!(r["token_ids"], json!(["0123456789ab"]));
        assert_eq!(r["expires_unix_s"], Value::Null);
        assert_eq!(r["jobs_started"], 2);
        // The text form shows the same reservation with the display label.
        assert!(reservations_text(&listed.reservations)
            .starts_with("reserved for salush1 (uid 1001): 1 GiB (1 MiB claimed"));
        let expiring = Reservation {
            expires_unix_seconds: 1.8e9,
            ..reservation
        };
        assert_eq!(reservation_json(&expiring)["expires_unix_s"], 1.8e9);
        let empty = jobs_json(&ListJobsResponse::default());
        assert_eq!(empty, json!({"jobs": [], "reservations": []}));
    }

    #[test]
    fn uids_parse() {
        assert_eq!(resolve_uid("root").unwrap(), 0);
        assert_eq!(resolve_uid("1234").unwrap(), 1234);
        assert!(resolve_uid("no-such-user-here").is_err());
    }

    #[test]
    fn stats_render() {
        let s = SchedulerStats {
            policy: "srtf".into(),
            iterations_total: 10,
            switch_latency: Some(LatencySummary {
                count: 4,
                p50_us: 12.0,
                p99_us: 40.0,
                max_us: 41.0,
                buckets: vec![],
                sum_us: 100.0,
            }),
            queue_wait: Some(LatencySummary {
                count: 2,
                p50_us: 7.0,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(
            stats_text(&s).contains("queue wait       2 samples, p50 7.0 us"),
            "{}",
            stats_text(&s)
        );
        assert_eq!(stats_json(&s)["queue_wait_us"]["count"], 2);
        let info = ServerInfo {
            admission_refusals: 2,
            eager_contexts_reclaimed: 1,
            run_errors: vec![
                ErrorCount {
                    code: "INVALID_ARGUMENT".into(),
                    count: 3,
                },
                ErrorCount {
                    code: "ABORTED".into(),
                    count: 0,
                },
            ],
            ..Default::default()
        };
        let text = counters_text(&info);
        assert!(text.contains("0 waited, 2 refused, 0 timed out"), "{text}");
        assert!(
            text.contains("0 graph sessions, 1 eager contexts"),
            "{text}"
        );
        assert!(
            text.contains("failed runs      INVALID_ARGUMENT 3\n"),
            "{text}"
        );
        assert_eq!(counters_json(&info)["run_errors"]["INVALID_ARGUMENT"], 3);
        assert!(stats_text(&s).contains("p50 12.0 us, p99 40.0 us"));
        let s = SchedulerStats {
            share: "tenants".into(),
            tenants: vec![
                TenantShare {
                    tenant: "alice (uid 1001)".into(),
                    tenant_name: "alice".into(),
                    tenant_uid: Some(1001),
                    weight: 1,
                    device_seconds: 3.0,
                    jobs: 1,
                    queued: 1,
                    limits: None,
                    memory_bytes: 0,
                    refusals: 0,
                },
                TenantShare {
                    tenant: "bob (uid 1002)".into(),
                    tenant_name: "bob".into(),
                    tenant_uid: Some(1002),
                    weight: 2,
                    device_seconds: 1.0,
                    jobs: 8,
                    queued: 0,
                    limits: Some(TenantLimits {
                        weight: Some(2),
                        max_jobs: Some(8),
                        max_priority: None,
                        memory_bytes: None,
                    }),
                    memory_bytes: 1 << 30,
                    refusals: 2,
                },
            ],
            ..s
        };
        let text = stats_text(&s);
        assert!(text.contains("shared between   tenants\n"), "{text}");
        assert!(
            text.contains("tenant bob (uid 1002): 1.000 s device time (25.0% of the tenants shown), weight 2, 8 jobs"),
            "{text}"
        );
        assert!(text.contains("limits weight=2 max-jobs=8\n"), "{text}");
        assert!(text.contains("0 refused; limits none\n"), "{text}");
        assert_eq!(stats_json(&s)["tenants"][1]["max_jobs"], 8);
        assert_eq!(stats_json(&s)["tenants"][1]["tenant"], "bob");
        assert_eq!(stats_json(&s)["tenants"][1]["uid"], 1002);
        assert_eq!(stats_json(&s)["tenants"][0]["device_s"], 3.0);
        assert_eq!(stats_json(&s)["switch_latency_us"]["p99"], 40.0);
    }

    #[test]
    fn timeline_text_names_a_job_whose_last_span_has_no_label() {
        let span = |name: &str, kind: &str| TimelineSpan {
            job: 9,
            job_name: name.into(),
            kind: kind.into(),
            lane: Some(0),
            start_seconds_ago: 1.0,
            end_seconds_ago: 0.5,
            cheap: false,
        };
        let t = Timeline {
            spans: vec![span("", ""), span("train", "eager"), span("", "")],
            ..Default::default()
        };
        let text = timeline_text(&t, 2.0);
        assert!(text.contains("  job 9 train (eager): 3 main"), "{text}");
    }

    #[test]
    fn timeline_text_counts_runs_and_busy_time_per_lane_and_job() {
        let span = |job, lane, start, end, cheap| TimelineSpan {
            job,
            job_name: format!("j{job}"),
            kind: "graph".into(),
            lane,
            start_seconds_ago: start,
            end_seconds_ago: end,
            cheap,
        };
        let t = Timeline {
            capacity: 100,
            recorded_total: 7,
            spans: vec![
                // Started before the 2 s window: only its last second counts.
                span(1, Some(0), 3.0, 1.0, false),
                span(2, Some(0), 0.5, 0.0, false),
                span(2, Some(0), 0.6, 0.5, true),
                span(3, None, 0.2, 0.1, true),
            ],
            ..Default::default()
        };
        let text = timeline_text(&t, 2.0);
        assert!(
            text.starts_with(
                "timeline: 4 runs in the last 2.0 s (7 recorded since start, the server keeps 100)"
            ),
            "{text}"
        );
        assert!(text.contains("lane 0: busy 80.0%"), "{text}");
        assert!(
            text.contains("  job 1 j1 (graph): 1 main (1.000 s), 0 cheap (0.000 s)"),
            "{text}"
        );
        assert!(
            text.contains("  job 2 j2 (graph): 1 main (0.500 s), 1 cheap (0.100 s)"),
            "{text}"
        );
        assert!(
            text.contains("no lane yet (before memory admission): busy 5.0%"),
            "{text}"
        );
        let json = timeline_json(&t, 2.0);
        assert_eq!(json["spans"][3]["lane"], Value::Null);
        assert_eq!(json["spans"][2]["run"], "cheap");
        assert_eq!(json["spans"][0]["start_ago_s"], 3.0);
    }

    /// Every key a `--json` output has is documented in docs/src/reference/json.md.
    #[test]
    fn json_md_documents_every_key() {
        fn keys(value: &Value, out: &mut std::collections::BTreeSet<String>) {
            match value {
                Value::Object(map) => {
                    for (key, inner) in map {
                        out.insert(key.clone());
                        // run_errors is keyed by gRPC code names, not by fixed keys.
                        if key != "run_errors" {
                            keys(inner, out);
                        }
                    }
                }
                Value::Array(items) => items.iter().for_each(|i| keys(i, out)),
                _ => {}
            }
        }
        let listed = ListJobsResponse {
            jobs: vec![job()],
            reservations: vec![Reservation::default()],
        };
        let info = ServerInfo {
            devices: vec![Device::default()],
            executors: vec![ExecutorProcess::default()],
            ..Default::default()
        };
        let stats = SchedulerStats {
            lanes: vec![LaneQueue::default()],
            tenants: vec![TenantShare::default()],
            ..Default::default()
        };
        let history = ListHistoryResponse {
            identities: vec![HistoryIdentity {
                runs: vec![HistoryRun::default()],
                ..Default::default()
            }],
            ..Default::default()
        };
        let timeline = Timeline {
            spans: vec![TimelineSpan::default()],
            ..Default::default()
        };
        let mut token = tokens::token_json(&TokenInfo::default());
        token["token"] = json!("secret");
        let documents = [
            jobs_json(&listed),
            stats_json(&stats),
            counters_json(&info),
            json!({ "server_counters": null, "previous": null, "policy": null, "erased_identities": 0 }),
            limits_json("t", &TenantLimits::default()),
            capacity_json(&info),
            info::info_json(&info),
            token,
            history::history_json(&history),
            drain::drain_json(&DrainStatus {
                jobs: vec![job()],
                ..Default::default()
            }),
            drain::reload_json(&ReloadResponse::default()),
            timeline_json(&timeline, 1.0),
            json!({ "server": "", "info": null, "stats": null, "jobs": [] }),
        ];
        let mut all = std::collections::BTreeSet::new();
        for document in &documents {
            keys(document, &mut all);
        }
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/src/reference/json.md"
        ))
        .unwrap();
        let undocumented: Vec<_> = all
            .iter()
            .filter(|k| !doc.contains(&format!("`{k}`")))
            .collect();
        assert!(
            undocumented.is_empty(),
            "keys missing from docs/src/reference/json.md: {undocumented:?}"
        );
    }
}
