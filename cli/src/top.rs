//! `salus top`: a live view of lanes, jobs and queues; and the timeline's
//! chart, which Python's matplotlib draws.

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use clap::Args;
use salus_proto::salus::v1::*;
use serde_json::{json, Value};

use crate::commands::{self, info_json, job_json, lane_of, lane_text, stats_json};
use crate::error::CliError;
use crate::units::parse_duration;
use crate::Connection;

#[derive(Args, Debug)]
pub struct TopArgs {
    /// Time between refreshes (1s, 500ms; a bare number is seconds).
    #[arg(short = 'd', long, visible_alias = "delay", default_value = "1s", value_name = "DURATION", value_parser = parse_duration)]
    interval: Duration,
    /// Stop after N frames (default: until Ctrl-C).
    #[arg(short = 'n', long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    iterations: Option<u64>,
    /// Print one frame and exit (as --iterations 1).
    #[arg(long, conflicts_with = "iterations")]
    once: bool,
    /// Append frames instead of redrawing the screen (the default when not on a terminal).
    #[arg(long)]
    no_clear: bool,
    /// Each frame as one line of JSON: {"server", "info", "stats", "jobs"} with
    /// the keys of `info --json`, `stats --json` and `jobs --json`'s jobs.
    #[arg(long)]
    json: bool,
}

/// What one frame shows.
struct Frame {
    info: ServerInfo,
    stats: SchedulerStats,
    jobs: Vec<JobInfo>,
}

async fn fetch(
    admin: &mut admin_client::AdminClient<tonic::transport::Channel>,
) -> Result<Frame, CliError> {
    Ok(Frame {
        info: admin
            .get_server_info(GetServerInfoRequest {})
            .await?
            .into_inner(),
        stats: admin.get_stats(GetStatsRequest {}).await?.into_inner(),
        jobs: admin.list_jobs(ListJobsRequest {}).await?.into_inner().jobs,
    })
}

fn is_terminal() -> bool {
    // SAFETY: isatty only reads the descriptor's state.
    unsafe { libc::isatty(1) == 1 }
}

fn terminal_width() -> Option<usize> {
    // SAFETY: TIOCGWINSZ fills a winsize, which is plain data.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut size) } == 0;
    (ok && size.ws_col > 0).then_some(size.ws_col as usize)
}

pub fn top(conn: &Connection, args: TopArgs) -> Result<(), CliError> {
    let frames = if args.once { Some(1) } else { args.iterations };
    let redraw = is_terminal() && !args.no_clear && !args.json;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Local(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(async {
        let mut admin = commands::connect(conn).await?;
        let mut previous: HashMap<u64, (u64, Instant)> = HashMap::new();
        let mut shown = 0u64;
        let mut stdout = std::io::stdout();
        if redraw {
            let _ = stdout.write_all(b"\x1b[?25l"); // hide the cursor
        }
        let result = loop {
            let frame = match fetch(&mut admin).await {
                Ok(frame) => Ok(frame),
                // A lost connection after the first frame is shown, and retried.
                Err(e) if shown > 0 && e.exit_code() == crate::EXIT_UNREACHABLE => {
                    Err(e.render(&conn.server))
                }
                Err(e) => break Err(e),
            };
            let text = if args.json {
                match &frame {
                    Ok(f) => {
                        let mut line =
                            serde_json::to_string(&frame_json(&conn.server, f)).unwrap_or_default();
                        line.push('\n');
                        line
                    }
                    Err(error) => format!("{}\n", json!({ "server": conn.server, "error": error })),
                }
            } else {
                let width = if redraw { terminal_width() } else { None };
                render_top(
                    &conn.server,
                    frame.as_ref().map_err(|e| e.as_str()),
                    &previous,
                    args.interval,
                    width,
                )
            };
            if let Ok(f) = &frame {
                let now = Instant::now();
                previous = f.jobs.iter().map(|j| (j.id, (j.iterations, now))).collect();
            }
            let written = if redraw {
                stdout.write_all(format!("\x1b[H\x1b[2J{text}").as_bytes())
            } else if shown > 0 && !args.json {
                stdout.write_all(format!("\n{text}").as_bytes())
            } else {
                stdout.write_all(text.as_bytes())
            };
            // A closed pipe (`salus top | head`) ends the view.
            if written.and_then(|_| stdout.flush()).is_err() {
                break Ok(());
            }
            shown += 1;
            if frames.is_some_and(|n| shown >= n) {
                break Ok(());
            }
            tokio::select! {
                _ = tokio::time::sleep(args.interval) => {}
                _ = tokio::signal::ctrl_c() => break Ok(()),
            }
        };
        if redraw {
            let _ = stdout.write_all(b"\x1b[?25h\n");
            let _ = stdout.flush();
        }
        result
    })
}

fn frame_json(server: &str, f: &Frame) -> Value {
    json!({
        "server": server,
        "info": info_json(&f.info),
        "stats": stats_json(&f.stats),
        "jobs": f.jobs.iter().map(job_json).collect::<Vec<_>>(),
    })
}

/// "1d 2:03:04": an uptime or a job's age.
fn clock(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    let (d, s) = (s / 86400, s % 86400);
    let (h, s) = (s / 3600, s % 3600);
    let (m, s) = (s / 60, s % 60);
    let days = if d > 0 {
        format!("{d}d ")
    } else {
        String::new()
    };
    format!("{days}{h}:{m:02}:{s:02}")
}

fn state_rank(state: &str) -> u8 {
    match state {
        "running" => 0,
        "queued" => 1,
        "idle" => 2,
        _ => 3,
    }
}

/// One frame as text; `previous` maps a job id to its iterations at the previous frame.
fn render_top(
    server: &str,
    frame: Result<&Frame, &str>,
    previous: &HashMap<u64, (u64, Instant)>,
    interval: Duration,
    width: Option<usize>,
) -> String {
    let now = clock_now();
    let refresh = format!("refresh {}s", interval.as_secs_f64());
    let f = match frame {
        Ok(f) => f,
        Err(error) => {
            return format!(
                "salus top - {server} - {now} - {refresh}\nconnection lost: {error} (retrying)\n"
            );
        }
    };
    let (info, stats, jobs) = (&f.info, &f.stats, &f.jobs);
    let or_unknown = |s: &str| {
        if s.is_empty() {
            "?".to_string()
        } else {
            s.to_string()
        }
    };
    let mut lines = vec![
        format!(
            "salus top - {server} - {now} - up {} - policy {} - {refresh}",
            clock(info.uptime_seconds),
            info.policy
        ),
        format!(
            "server {} (TensorFlow {}) - devices: {}",
            or_unknown(&info.version),
            or_unknown(&info.tensorflow_version),
            if info.devices.is_empty() {
                "-".to_string()
            } else {
                info.devices
                    .iter()
                    .map(|d| {
                        d.name
                            .rsplit("/device:")
                            .next()
                            .unwrap_or(&d.name)
                            .to_string()
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ),
    ];
    if info.memory_capacity_bytes > 0 {
        lines.push(format!(
            "memory: {} shared, {} reserved by tokens, {} free",
            crate::units::size_text(info.memory_capacity_bytes),
            crate::units::size_text(info.memory_reserved_bytes),
            crate::units::size_text(info.memory_free_bytes)
        ));
    }
    let lat = stats.switch_latency.clone().unwrap_or_default();
    lines.push(format!(
        "jobs: {} open, {} created - runs: {} - iterations: {} ({:.1}/s) - queued: {} - dropped: {}",
        jobs.len(),
        info.sessions_created,
        info.runs_completed,
        stats.iterations_total,
        stats.iterations_per_second,
        stats.queued,
        stats.dropped_iterations
    ));
    lines.push(format!(
        "switch latency: p50 {:.1} us, p99 {:.1} us, max {:.1} us ({} switches)",
        lat.p50_us, lat.p99_us, lat.max_us, lat.count
    ));
    lines.push(String::new());
    let label = |j: &JobInfo| {
        if j.name.is_empty() {
            j.id.to_string()
        } else {
            j.name.clone()
        }
    };
    let on_lane = |lane: u32, state: &str| {
        let names: Vec<String> = jobs
            .iter()
            .filter(|j| lane_of(j) == Some(lane) && j.state == state)
            .map(label)
            .collect();
        if names.is_empty() {
            "-".to_string()
        } else {
            names.join(" ")
        }
    };
    let lane_rows: Vec<Vec<String>> = stats
        .lanes
        .iter()
        .map(|q| {
            vec![
                q.lane.to_string(),
                q.running.to_string(),
                q.queued.to_string(),
                on_lane(q.lane, "running"),
                on_lane(q.lane, "queued"),
            ]
        })
        .collect();
    if lane_rows.is_empty() {
        lines.push("no lanes".into());
    } else {
        lines.push(
            commands::table(
                &["LANE", "RUNNING", "QUEUED", "RUNNING_JOB", "WAITING_JOBS"],
                &lane_rows,
            )
            .trim_end()
            .to_string(),
        );
    }
    lines.push(String::new());
    if jobs.is_empty() {
        lines.push("no jobs".into());
    } else {
        let now = Instant::now();
        let mut sorted: Vec<&JobInfo> = jobs.iter().collect();
        sorted.sort_by_key(|j| (state_rank(&j.state), j.id));
        let rows: Vec<Vec<String>> = sorted
            .into_iter()
            .map(|j| {
                let h = j.hints.unwrap_or_default();
                let rate = match previous.get(&j.id) {
                    Some(&(before, at)) if now > at => format!(
                        "{:.1}",
                        j.iterations.saturating_sub(before) as f64 / (now - at).as_secs_f64()
                    ),
                    _ => "-".into(),
                };
                let done = if h.expected_iterations > 0 {
                    format!(
                        "{:.0}%",
                        (100.0 * j.iterations as f64 / h.expected_iterations as f64).min(100.0)
                    )
                } else {
                    "-".into()
                };
                vec![
                    j.id.to_string(),
                    if j.kind.is_empty() {
                        "graph".into()
                    } else {
                        j.kind.clone()
                    },
                    commands::or_dash(&j.name),
                    commands::or_dash(&j.tenant),
                    j.state.clone(),
                    lane_text(j),
                    j.iterations.to_string(),
                    rate,
                    done,
                    format!("{:.2}", j.mean_iteration_ms),
                    format!("{:.2}", j.attained_seconds),
                    format!("{:.2}", j.queue_wait_seconds),
                    j.queued.to_string(),
                    h.priority.to_string(),
                    clock(j.age_seconds),
                    j.note.clone(),
                ]
            })
            .collect();
        lines.push(
            commands::table(
                &[
                    "ID",
                    "KIND",
                    "NAME",
                    "TENANT",
                    "STATE",
                    "LANE",
                    "ITERS",
                    "IT/S",
                    "DONE",
                    "MEAN_MS",
                    "ATTAINED_S",
                    "WAIT_S",
                    "QUEUED",
                    "PRIO",
                    "AGE",
                    "NOTE",
                ],
                &rows,
            )
            .trim_end()
            .to_string(),
        );
    }
    let mut out = String::new();
    for line in lines {
        match width {
            Some(w) => out.extend(line.chars().take(w)),
            None => out += &line,
        }
        out.push('\n');
    }
    out
}

/// HH:MM:SS of the local clock.
fn clock_now() -> String {
    // SAFETY: time and localtime_r only fill the values given.
    unsafe {
        let now = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&now, &mut tm).is_null() {
            return "--:--:--".into();
        }
        format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_shows_lanes_jobs_and_no_lane_as_a_dash() {
        let frame = Frame {
            info: ServerInfo {
                version: "0.1.0".into(),
                policy: "fair".into(),
                uptime_seconds: 3725.0,
                memory_capacity_bytes: 2 << 30,
                ..Default::default()
            },
            stats: SchedulerStats {
                lanes: vec![LaneQueue {
                    lane: 0,
                    running: 1,
                    queued: 0,
                }],
                ..Default::default()
            },
            jobs: vec![
                JobInfo {
                    id: 1,
                    name: "a".into(),
                    state: "running".into(),
                    iterations: 10,
                    ..Default::default()
                },
                JobInfo {
                    id: 2,
                    name: "b".into(),
                    state: "queued".into(),
                    memory_state: "waiting for memory".into(),
                    hints: Some(JobHints {
                        priority: 0,
                        expected_iterations: 40,
                        expected_seconds: 0.0,
                    }),
                    iterations: 10,
                    ..Default::default()
                },
            ],
        };
        let text = render_top(
            "h:1",
            Ok(&frame),
            &HashMap::new(),
            Duration::from_secs(1),
            None,
        );
        assert!(text.contains("up 1:02:05 - policy fair"), "{text}");
        assert!(text.contains("memory: 2 GiB shared"), "{text}");
        let row_b = text.lines().find(|l| l.starts_with("2 ")).unwrap();
        let cells: Vec<&str> = row_b.split_whitespace().collect();
        assert_eq!(cells[5], "-", "{row_b}");
        assert_eq!(cells[8], "25%", "{row_b}");
        let lane = text.lines().find(|l| l.starts_with("0 ")).unwrap();
        assert_eq!(
            lane.split_whitespace().collect::<Vec<_>>(),
            ["0", "1", "0", "a", "-"],
            "{lane}"
        );
        let lost = render_top(
            "h:1",
            Err("UNAVAILABLE"),
            &HashMap::new(),
            Duration::from_secs(1),
            None,
        );
        assert!(
            lost.contains("connection lost: UNAVAILABLE (retrying)"),
            "{lost}"
        );
        let v = frame_json("h:1", &frame);
        assert_eq!(v["jobs"][1]["lane"], Value::Null);
        assert_eq!(v["info"]["policy"], "fair");
    }
}
