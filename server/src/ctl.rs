//! `salus-server ctl`: a human (and `--json`) client of the admin API.

mod history;
mod info;

use clap::{Args, Subcommand};
use salus_proto::salus::v1::admin_client::AdminClient;
use salus_proto::salus::v1::*;
use serde_json::{json, Value};
use std::time::{SystemTime, UNIX_EPOCH};
use tonic::transport::Channel;

#[derive(Args, Debug)]
pub struct CtlArgs {
    /// Address of the salus-server to talk to.
    #[arg(long, env = "SALUS_SERVER", default_value = "127.0.0.1:5501")]
    pub server: String,
    /// The token to identify with (an admin token from --admins, or a
    /// tenant's); without one the server identifies a loopback caller by its
    /// Unix user.
    #[arg(long, env = "SALUS_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Subcommand, Debug)]
pub enum CtlCommand {
    /// List jobs: state, lane, iterations, attained time, queue wait, hints;
    /// and the device memory issued tokens reserve for tenants.
    Jobs {
        /// {"jobs": [...], "reservations": [...]} (keys in the README).
        #[arg(long)]
        json: bool,
    },
    /// Scheduler statistics: switch latency, queues, iterations per second, device time per tenant.
    Stats {
        /// As JSON, with the server's counters under "server_counters" (keys in the README).
        #[arg(long)]
        json: bool,
    },
    /// Show the scheduling policy, or switch to NAME (jobs are kept).
    Policy { name: Option<String> },
    /// Replace a job's hints (job id, session handle or name).
    Hints {
        job: String,
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        priority: i32,
        /// Expected main iterations (0: none).
        #[arg(long, default_value_t = 0)]
        iterations: u64,
        /// Expected total device seconds (0: none).
        #[arg(long, default_value_t = 0.0)]
        seconds: f64,
    },
    /// Change a tenant's limits (admins only): the ones given replace its
    /// earlier ones, the rest stay. TENANT: a user name, a tenants file name,
    /// anonymous, or * for every tenant without limits of its own.
    Limits {
        tenant: String,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Device memory this server shares and how much tokens reserve: what a
    /// cluster engine's config needs (Slurm's salusmem GRES count, Ray's
    /// salus_mem_mib resource), in MiB.
    Capacity {
        /// As JSON, in bytes and MiB (keys in the README).
        #[arg(long)]
        json: bool,
    },
    /// What the server runs on: versions, isolation, devices as TensorFlow
    /// lists them, GPU 0 as the CUDA driver reported it, and where the memory
    /// capacity comes from.
    Info {
        /// As JSON (keys in the README).
        #[arg(long)]
        json: bool,
    },
    /// Tokens issued at run time (admins only): issue, revoke, list.
    Token {
        #[command(subcommand)]
        action: TokenAction,
    },
    /// The job history the `learned` policy ranks by: each job identity's
    /// runs and expected length; `history erase` forgets a tenant's.
    History {
        #[command(subcommand)]
        action: Option<history::HistoryAction>,
        /// Whose: yours by default; an admin may name any tenant (and sees
        /// every tenant's without one).
        #[arg(long, global = true)]
        tenant: Option<String>,
        /// As JSON (keys in the README).
        #[arg(long, global = true)]
        json: bool,
    },
    /// Recent main iterations and cheap runs: per lane, per job counts and busy time.
    Timeline {
        /// Runs that ended in the last S seconds (0: all the server keeps).
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Every span, as JSON (times in seconds before the server's "now").
        #[arg(long)]
        json: bool,
    },
}

/// A tenant's limits on the command line (unset: unchanged).
#[derive(Args, Debug)]
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
    #[arg(long, value_parser = crate::sched::units::parse_size)]
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
        #[arg(long)]
        expires: Option<String>,
        /// Print the token and its record as JSON instead of the token alone.
        #[arg(long)]
        json: bool,
    },
    /// Revoke the token with this id, or every token of this tenant.
    Revoke {
        which: String,
        /// The revoked tokens' records as a JSON array (the keys of `token list --json`).
        #[arg(long)]
        json: bool,
    },
    /// The tokens issued and valid: id, tenant, user, limits, expiry (never the tokens).
    List {
        /// As a JSON array of token records (keys in the README).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("cannot connect to salus-server at {addr}: {source}")]
    Connect {
        addr: String,
        source: tonic::transport::Error,
    },
    #[error("invalid server address {0:?}")]
    Address(String),
    #[error("{}", .0.message())]
    Rpc(#[from] tonic::Status),
    #[error("{0}")]
    Usage(String),
    #[error("this server shares no device memory: start it with --memory-capacity SIZE (or, built with --features cuda, on a GPU)")]
    NoCapacity,
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

async fn connect(server: &str, token: Option<&str>) -> Result<AdminClient<Channel>, CtlError> {
    let url = if server.contains("://") {
        server.replace("grpc://", "http://")
    } else {
        format!("http://{server}")
    };
    let mut endpoint =
        Channel::from_shared(url).map_err(|_| CtlError::Address(server.to_string()))?;
    if let Some(token) = token {
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
        .map_err(|source| CtlError::Connect {
            addr: server.to_string(),
            source,
        })?;
    Ok(AdminClient::new(channel))
}

/// Runs one command and returns what to print.
pub async fn run(args: CtlArgs) -> Result<String, CtlError> {
    let mut admin = connect(&args.server, args.token.as_deref()).await?;
    Ok(match args.command {
        CtlCommand::Jobs { json } => {
            let listed = admin.list_jobs(ListJobsRequest {}).await?.into_inner();
            if json {
                pretty(&jobs_json(&listed))
            } else {
                jobs_table(&listed.jobs) + &reservations_text(&listed.reservations)
            }
        }
        CtlCommand::Limits { tenant, limits } => {
            let now = admin
                .set_tenant_limits(SetTenantLimitsRequest {
                    tenant: tenant.clone(),
                    limits: Some(limits.to_proto()),
                })
                .await?
                .into_inner();
            format!("limits of {tenant}: {}\n", limits_text(Some(&now)))
        }
        CtlCommand::Token { action } => token(&mut admin, action).await?,
        CtlCommand::History {
            action,
            tenant,
            json,
        } => history::run(&mut admin, action, tenant, json).await?,
        CtlCommand::Info { json } => {
            let info = admin
                .get_server_info(GetServerInfoRequest {})
                .await?
                .into_inner();
            if json {
                pretty(&info::info_json(&info))
            } else {
                info::info_text(&info)
            }
        }
        CtlCommand::Capacity { json } => {
            let info = admin
                .get_server_info(GetServerInfoRequest {})
                .await?
                .into_inner();
            if info.memory_capacity_bytes == 0 {
                return Err(CtlError::NoCapacity);
            }
            if json {
                pretty(&capacity_json(&info))
            } else {
                capacity_text(&info)
            }
        }
        CtlCommand::Stats { json } => {
            let stats = admin.get_stats(GetStatsRequest {}).await?.into_inner();
            let info = admin
                .get_server_info(GetServerInfoRequest {})
                .await?
                .into_inner();
            if json {
                let mut value = stats_json(&stats);
                value["server_counters"] = counters_json(&info);
                pretty(&value)
            } else {
                stats_text(&stats) + &counters_text(&info)
            }
        }
        CtlCommand::Policy { name: None } => {
            format!(
                "policy: {}\n",
                admin
                    .get_server_info(GetServerInfoRequest {})
                    .await?
                    .into_inner()
                    .policy
            )
        }
        CtlCommand::Policy { name: Some(policy) } => {
            let r = admin
                .set_policy(SetPolicyRequest { policy })
                .await?
                .into_inner();
            format!("policy: {} -> {}\n", r.previous, r.policy)
        }
        CtlCommand::Hints {
            job,
            priority,
            iterations,
            seconds,
        } => {
            let hints = Some(JobHints {
                priority,
                expected_iterations: iterations,
                expected_seconds: seconds,
            });
            let info = admin
                .set_job_hints(SetJobHintsRequest { job, hints })
                .await?
                .into_inner();
            jobs_table(&[info])
        }
        CtlCommand::Timeline { seconds, json } => {
            let timeline = admin
                .get_timeline(GetTimelineRequest { seconds })
                .await?
                .into_inner();
            if json {
                pretty(&timeline_json(&timeline, seconds))
            } else {
                timeline_text(&timeline, seconds)
            }
        }
    })
}

fn pretty(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_else(|_| "null".into());
    text.push('\n');
    text
}

fn opt<T: PartialEq + Default + Into<Value>>(v: T) -> Value {
    if v == T::default() {
        Value::Null
    } else {
        v.into()
    }
}

/// `ctl jobs --json`: an object, so that what the text form shows besides
/// the jobs (the reservations) has a place, and later additions break no reader.
pub fn jobs_json(listed: &ListJobsResponse) -> Value {
    json!({
        "jobs": listed.jobs.iter().map(job_json).collect::<Vec<_>>(),
        "reservations": listed.reservations.iter().map(reservation_json).collect::<Vec<_>>(),
    })
}

pub fn job_json(j: &JobInfo) -> Value {
    let hints = j.hints.clone().unwrap_or_default();
    json!({
        "id": j.id,
        "handle": j.handle,
        "name": j.name,
        // The bare name and the uid apart (as in `ctl token list --json`), not
        // the display label "alice (uid 1001)" of the text form.
        "tenant": j.tenant_name,
        "uid": j.tenant_uid,
        "kind": j.kind,
        "state": j.state,
        // A job waiting for (or not yet asking for) memory has no lane.
        "lane": if matches!(j.memory_state.as_str(), "waiting for memory" | "not admitted yet") {
            Value::Null
        } else {
            j.lane.into()
        },
        "policy": j.policy,
        "iterations": j.iterations,
        "attained_s": j.attained_seconds,
        "service_s": j.service_seconds,
        "mean_iteration_ms": j.mean_iteration_ms,
        "queue_wait_s": j.queue_wait_seconds,
        "queued": j.queued,
        "priority": hints.priority,
        "expected_iterations": opt(hints.expected_iterations),
        "expected_seconds": opt(hints.expected_seconds),
        "note": j.note,
        "graph_version": j.graph_version,
        "graph_nodes": j.graph_nodes,
        "runs_completed": j.runs_completed,
        "runs_failed": j.runs_failed,
        "cheap_runs": j.cheap_runs,
        "age_s": j.age_seconds,
        "idle_s": j.idle_seconds,
        "variable_bytes": j.variable_bytes,
        "variables": j.variables,
        "variables_of_unknown_size": j.variables_of_unknown_size,
        "memory_state": j.memory_state,
        "persistent_estimate_bytes": j.persistent_estimate_bytes,
        "ephemeral_estimate_bytes": j.ephemeral_estimate_bytes,
        "persistent_source": j.persistent_source,
        "ephemeral_source": j.ephemeral_source,
        "ephemeral_meter": j.ephemeral_meter,
        "ephemeral_allocator_bytes": j.ephemeral_allocator_bytes,
        "identity": opt(j.identity.clone()),
        "history_expected_s": (j.history_runs > 0).then_some(j.history_expected_seconds),
        "history_runs": j.history_runs,
    })
}

pub fn stats_json(s: &SchedulerStats) -> Value {
    let l = s.switch_latency.clone().unwrap_or_default();
    json!({
        "policy": s.policy,
        "iterations_total": s.iterations_total,
        "iterations_per_s": s.iterations_per_second,
        "queued": s.queued,
        "cheap_runs_total": s.cheap_runs_total,
        "dropped_iterations": s.dropped_iterations,
        "lane_holds_released": s.lane_holds_released,
        "switch_latency_us": {"count": l.count, "p50": l.p50_us, "p99": l.p99_us, "max": l.max_us, "buckets": l.buckets},
        "iteration_time_us": latency_json(s.iteration_time.as_ref()),
        "queue_wait_us": latency_json(s.queue_wait.as_ref()),
        "handover_latency_us": latency_json(s.handover_latency.as_ref()),
        "lanes": s.lanes.iter().map(|q| json!({"lane": q.lane, "queued": q.queued, "running": q.running})).collect::<Vec<_>>(),
        "share": s.share,
        "tenants": s.tenants.iter().map(|t| {
            let l = t.limits.unwrap_or_default();
            json!({
                "tenant": t.tenant_name, "uid": t.tenant_uid, "weight": t.weight, "device_s": t.device_seconds, "jobs": t.jobs, "queued": t.queued,
                "memory_bytes": t.memory_bytes, "refusals": t.refusals,
                "max_jobs": l.max_jobs, "max_priority": l.max_priority, "max_memory_bytes": l.memory_bytes,
            })
        }).collect::<Vec<_>>(),
    })
}

fn latency_json(l: Option<&LatencySummary>) -> Value {
    let l = l.cloned().unwrap_or_default();
    json!({"count": l.count, "sum": l.sum_us, "p50": l.p50_us, "p99": l.p99_us, "max": l.max_us, "buckets": l.buckets})
}

/// "N samples, p50 .. us, p99 .. us, max .. us" of a latency summary.
fn latency_line(l: Option<&LatencySummary>) -> String {
    let l = l.cloned().unwrap_or_default();
    format!(
        "{} samples, p50 {:.1} us, p99 {:.1} us, max {:.1} us",
        l.count, l.p50_us, l.p99_us, l.max_us
    )
}

/// The server-wide event counters of `GetServerInfo` (admission, reclaimed jobs, failed runs).
pub fn counters_json(info: &ServerInfo) -> Value {
    json!({
        "admission_waits": info.admission_waits,
        "admission_refusals": info.admission_refusals,
        "admission_timeouts": info.admission_timeouts,
        "sessions_reclaimed": info.sessions_reclaimed,
        "eager_contexts_reclaimed": info.eager_contexts_reclaimed,
        "executors_started": info.executors_started,
        "executors_failed": info.executors_failed,
        "run_errors": info.run_errors.iter().map(|e| (e.code.clone(), Value::from(e.count))).collect::<serde_json::Map<_, _>>(),
    })
}

pub fn counters_text(info: &ServerInfo) -> String {
    let failed: Vec<String> = info
        .run_errors
        .iter()
        .filter(|e| e.count > 0)
        .map(|e| format!("{} {}", e.code, e.count))
        .collect();
    format!(
        "admission        {} waited, {} refused, {} timed out\nreclaimed        {} graph sessions, {} eager contexts\nexecutors        {} running, {} started, {} failed\nfailed runs      {}\n",
        info.admission_waits,
        info.admission_refusals,
        info.admission_timeouts,
        info.sessions_reclaimed,
        info.eager_contexts_reclaimed,
        info.executors_running,
        info.executors_started,
        info.executors_failed,
        if failed.is_empty() { "none".to_string() } else { failed.join(", ") }
    )
}

/// Left-aligned columns separated by two spaces.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
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

pub fn jobs_table(jobs: &[JobInfo]) -> String {
    if jobs.is_empty() {
        return "no jobs\n".into();
    }
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            let h = j.hints.clone().unwrap_or_default();
            let expected = match (h.expected_iterations, h.expected_seconds) {
                (0, s) if s == 0.0 => "-".to_string(),
                (0, s) => format!("{s}s"),
                (n, s) if s == 0.0 => format!("{n} it"),
                (n, s) => format!("{n} it/{s}s"),
            };
            vec![
                j.id.to_string(),
                j.kind.clone(),
                if j.name.is_empty() {
                    "-".into()
                } else {
                    j.name.clone()
                },
                if j.tenant.is_empty() {
                    "-".into()
                } else {
                    j.tenant.clone()
                },
                j.state.clone(),
                j.lane.to_string(),
                j.iterations.to_string(),
                format!("{:.3}", j.attained_seconds),
                format!("{:.2}", j.mean_iteration_ms),
                format!("{:.3}", j.queue_wait_seconds),
                j.queued.to_string(),
                h.priority.to_string(),
                expected,
                [history::job_history_note(j), Some(j.note.clone())]
                    .into_iter()
                    .flatten()
                    .filter(|n| !n.is_empty())
                    .collect::<Vec<_>>()
                    .join("; "),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "KIND",
            "NAME",
            "TENANT",
            "STATE",
            "LANE",
            "ITERS",
            "ATTAINED_S",
            "MEAN_MS",
            "WAIT_S",
            "QUEUED",
            "PRIO",
            "EXPECTED",
            "NOTE",
        ],
        &rows,
    )
}

pub fn stats_text(s: &SchedulerStats) -> String {
    let mut out = format!(
        "policy           {}\niterations       {} ({:.1}/s over the last minute)\ncheap runs       {}\nqueued           {}\ndropped          {}\nlane holds cut   {}\nswitch latency   {}\niteration time   {}\nqueue wait       {}\n",
        s.policy,
        s.iterations_total,
        s.iterations_per_second,
        s.cheap_runs_total,
        s.queued,
        s.dropped_iterations,
        s.lane_holds_released,
        latency_line(s.switch_latency.as_ref()),
        latency_line(s.iteration_time.as_ref()),
        latency_line(s.queue_wait.as_ref()),
    );
    for q in &s.lanes {
        out += &format!(
            "lane {}           {} running, {} queued\n",
            q.lane, q.running, q.queued
        );
    }
    out += &format!("shared between   {}\n", s.share);
    let total: f64 = s.tenants.iter().map(|t| t.device_seconds).sum();
    for t in &s.tenants {
        let percent = if total > 0.0 {
            100.0 * t.device_seconds / total
        } else {
            0.0
        };
        out += &format!(
            "tenant {}: {:.3} s device time ({percent:.1}% of the tenants shown), weight {}, {} jobs, {} iterations queued or running, {} bytes of memory, {} refused; limits {}\n",
            t.tenant, t.device_seconds, t.weight, t.jobs, t.queued, t.memory_bytes, t.refusals, limits_text(t.limits.as_ref())
        );
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
            let expires_seconds = expires
                .map(|e| parse_duration(&e))
                .transpose()?
                .unwrap_or(0.0);
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
        TokenAction::Revoke { which, json } => {
            let revoked = admin
                .revoke_tokens(RevokeTokensRequest { which })
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

fn token_json(t: &TokenInfo) -> Value {
    let l = t.limits.unwrap_or_default();
    json!({
        "id": t.id, "tenant": t.tenant, "uid": t.uid,
        "weight": l.weight, "max_jobs": l.max_jobs, "max_priority": l.max_priority,
        "memory_bytes": l.memory_bytes,
        "issued_unix_s": t.issued_unix_seconds,
        "expires_unix_s": (t.expires_unix_seconds > 0.0).then_some(t.expires_unix_seconds),
    })
}

fn tokens_table(tokens: &[TokenInfo]) -> String {
    if tokens.is_empty() {
        return "no tokens issued\n".into();
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let mut out = format!(
        "{:<14}{:<24}{:<8}{:<14}{}\n",
        "ID", "TENANT", "UID", "EXPIRES IN", "LIMITS"
    );
    for t in tokens {
        let uid = t.uid.map_or("-".to_string(), |u| u.to_string());
        let expires = if t.expires_unix_seconds > 0.0 {
            format!("{:.0} s", (t.expires_unix_seconds - now).max(0.0))
        } else {
            "never".into()
        };
        out += &format!(
            "{:<14}{:<24}{:<8}{:<14}{}\n",
            t.id,
            t.tenant,
            uid,
            expires,
            limits_text(t.limits.as_ref())
        );
    }
    out
}

/// A uid, or a user name looked up on this machine.
fn resolve_uid(text: &str) -> Result<u32, CtlError> {
    if let Ok(uid) = text.parse() {
        return Ok(uid);
    }
    crate::tenant::users::Account::by_name(text)
        .map(|a| a.uid)
        .ok_or_else(|| CtlError::Usage(format!("--uid {text:?}: no such user on this machine")))
}

/// "90s", "15m", "2h", "7d" or a bare number of seconds.
fn parse_duration(text: &str) -> Result<f64, CtlError> {
    let bad = || {
        CtlError::Usage(format!(
            "--expires {text:?}: expected 90s, 15m, 2h, 7d or seconds"
        ))
    };
    let (number, unit) = match text.find(|c: char| c.is_ascii_alphabetic()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let value: f64 = number.trim().parse().map_err(|_| bad())?;
    let scale = match unit {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        _ => return Err(bad()),
    };
    if !(value.is_finite() && value > 0.0) {
        return Err(bad());
    }
    Ok(value * scale)
}

/// "weight=2 max-jobs=4" (the tenants file's words), or "none".
const MIB: u64 = 1 << 20;

fn capacity_json(info: &ServerInfo) -> Value {
    json!({
        "capacity_bytes": info.memory_capacity_bytes,
        "capacity_mib": info.memory_capacity_bytes / MIB,
        "reserved_bytes": info.memory_reserved_bytes,
        "held_back_bytes": info.memory_held_back_bytes,
        "free_bytes": info.memory_free_bytes,
        "unreserved_mib": info.memory_capacity_bytes.saturating_sub(info.memory_reserved_bytes) / MIB,
    })
}

/// The capacity, and the lines an engine's config takes it in.
fn capacity_text(info: &ServerInfo) -> String {
    let mib = info.memory_capacity_bytes / MIB;
    format!(
        "capacity   {mib} MiB ({} bytes)\n\
         reserved   {} MiB by tokens ({} MiB of it not used yet)\n\
         free       {} MiB not given to any lane\n\
         slurm      gres.conf: Name=salusmem Count={mib} Flags=CountOnly; slurm.conf node: Gres=salusmem:{mib}\n\
         ray        ray start --resources '{{\"salus_mem_mib\": {mib}}}'\n",
        info.memory_capacity_bytes,
        info.memory_reserved_bytes / MIB,
        info.memory_held_back_bytes / MIB,
        info.memory_free_bytes / MIB,
    )
}

/// A reservation with the keys of the other `--json` outputs (expiry: null for never).
pub fn reservation_json(r: &Reservation) -> Value {
    json!({
        "tenant": r.tenant_name,
        "uid": r.tenant_uid,
        "reserved_bytes": r.reserved_bytes,
        "claimed_bytes": r.claimed_bytes,
        "token_ids": r.token_ids,
        "expires_unix_s": (r.expires_unix_seconds > 0.0).then_some(r.expires_unix_seconds),
        "jobs_started": r.jobs_started,
    })
}

/// Lines on the memory issued tokens reserve (none without reservations).
pub fn reservations_text(reservations: &[Reservation]) -> String {
    let mut out = String::new();
    for r in reservations {
        let expires = if r.expires_unix_seconds > 0.0 {
            let left = r.expires_unix_seconds
                - SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64());
            format!(", expires in {:.0} s", left.max(0.0))
        } else {
            String::new()
        };
        out += &format!(
            "reserved for {}: {} bytes ({} claimed by its jobs; token {}{expires})\n",
            r.tenant,
            r.reserved_bytes,
            r.claimed_bytes,
            r.token_ids.join(", ")
        );
    }
    out
}

fn limits_text(l: Option<&TenantLimits>) -> String {
    let l = l.cloned().unwrap_or_default();
    let parts: Vec<String> = [
        l.weight.map(|w| format!("weight={w}")),
        l.max_jobs.map(|n| format!("max-jobs={n}")),
        l.max_priority.map(|p| format!("max-priority={p}")),
        l.memory_bytes.map(|m| format!("memory={m}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(" ")
    }
}

/// The timeline with the keys of `salus timeline --json`.
pub fn timeline_json(t: &Timeline, seconds: f64) -> Value {
    json!({
        "seconds": seconds,
        "now_uptime_s": t.now_uptime_seconds,
        "now_unix_s": t.now_unix_seconds,
        "capacity": t.capacity,
        "recorded_total": t.recorded_total,
        "spans": t.spans.iter().map(|s| json!({
            "job": s.job,
            "name": s.job_name,
            "kind": s.kind,
            "lane": s.lane,
            "start_ago_s": s.start_seconds_ago,
            "end_ago_s": s.end_seconds_ago,
            "run": if s.cheap { "cheap" } else { "main" },
        })).collect::<Vec<_>>(),
    })
}

/// Per lane: how busy it was and which jobs ran on it.
pub fn timeline_text(t: &Timeline, seconds: f64) -> String {
    use std::collections::BTreeMap;
    #[derive(Default)]
    struct Runs {
        name: String,
        kind: String,
        main: u64,
        main_s: f64,
        cheap: u64,
        cheap_s: f64,
    }
    // The window the shares are of: the one asked for, or back to the oldest span.
    let window = if seconds > 0.0 {
        seconds
    } else {
        t.spans
            .iter()
            .map(|s| s.start_seconds_ago)
            .fold(0.0, f64::max)
    };
    let mut lanes: BTreeMap<Option<u32>, BTreeMap<u64, Runs>> = BTreeMap::new();
    for s in &t.spans {
        let runs = lanes.entry(s.lane).or_default().entry(s.job).or_default();
        // A span recorded long after its job closed has no label: any named one names the job.
        if runs.name.is_empty() {
            runs.name.clone_from(&s.job_name);
        }
        if runs.kind.is_empty() {
            runs.kind.clone_from(&s.kind);
        }
        // Only the part inside the window counts toward busy time.
        let length = s.start_seconds_ago.min(window) - s.end_seconds_ago;
        let length = length.max(0.0);
        if s.cheap {
            runs.cheap += 1;
            runs.cheap_s += length;
        } else {
            runs.main += 1;
            runs.main_s += length;
        }
    }
    let mut out = format!(
        "timeline: {} runs in the last {:.1} s ({} recorded since start, the server keeps {})\n",
        t.spans.len(),
        window,
        t.recorded_total,
        t.capacity
    );
    for (lane, jobs) in &lanes {
        let busy: f64 = jobs.values().map(|r| r.main_s + r.cheap_s).sum();
        let share = if window > 0.0 {
            100.0 * busy / window
        } else {
            0.0
        };
        match lane {
            Some(lane) => out += &format!("lane {lane}: busy {share:.1}%\n"),
            None => out += &format!("no lane yet (before memory admission): busy {share:.1}%\n"),
        }
        for (id, r) in jobs {
            let name = if r.name.is_empty() { "?" } else { &r.name };
            out += &format!(
                "  job {id} {name} ({}): {} main ({:.3} s), {} cheap ({:.3} s)\n",
                if r.kind.is_empty() { "?" } else { &r.kind },
                r.main,
                r.main_s,
                r.cheap,
                r.cheap_s
            );
        }
    }
    out
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
        let waiting = JobInfo {
            memory_state: "waiting for memory".into(),
            ..job()
        };
        assert_eq!(job_json(&waiting)["lane"], Value::Null);
    }

    /// `ctl jobs --json` carries what the text form shows: the reservations
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
            .starts_with("reserved for salush1 (uid 1001): 1073741824 bytes (1048576 claimed"));
        let expiring = Reservation {
            expires_unix_seconds: 1.8e9,
            ..reservation
        };
        assert_eq!(reservation_json(&expiring)["expires_unix_s"], 1.8e9);
        let empty = jobs_json(&ListJobsResponse::default());
        assert_eq!(empty, json!({"jobs": [], "reservations": []}));
    }

    #[test]
    fn hints_accept_negative_priorities() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            ctl: CtlArgs,
        }
        let cli = Cli::try_parse_from(["ctl", "hints", "job1", "--priority", "-2"]).unwrap();
        assert!(matches!(
            cli.ctl.command,
            CtlCommand::Hints { priority: -2, .. }
        ));
    }

    #[test]
    fn durations_and_uids_parse() {
        assert_eq!(parse_duration("90").unwrap(), 90.0);
        assert_eq!(parse_duration("15m").unwrap(), 900.0);
        assert_eq!(parse_duration("2h").unwrap(), 7200.0);
        assert_eq!(parse_duration("1.5d").unwrap(), 129600.0);
        for bad in ["", "0", "-5s", "3w", "h"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
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
}
