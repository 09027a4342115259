//! The admin API's view of the run timeline (`GetTimeline`).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use salus_proto::salus::v1::{Timeline, TimelineSpan};

use crate::error::{Error, Result};
use crate::runtime::run_class::RunClass;
use crate::runtime::timeline::Snapshot;

/// The request's window: `seconds` > 0, or None (0) for the whole ring.
pub fn window(seconds: f64) -> Result<Option<Duration>> {
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(Error::InvalidArgument(
            "seconds must be a finite number >= 0 (0: every span the server keeps)".into(),
        ));
    }
    // Anything longer than the server has run is the whole ring.
    Ok((seconds > 0.0).then(|| Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX)))
}

/// Spans as seconds before the snapshot's moment, which is the reply's "now".
pub fn to_proto(snapshot: &Snapshot, server_started: Instant) -> Timeline {
    let now = snapshot.now;
    let ago = |t: Instant| now.saturating_duration_since(t).as_secs_f64();
    let unix_now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    Timeline {
        now_uptime_seconds: now.saturating_duration_since(server_started).as_secs_f64(),
        now_unix_seconds: unix_now,
        capacity: snapshot.capacity as u64,
        recorded_total: snapshot.recorded_total,
        spans: snapshot
            .spans
            .iter()
            .map(|s| TimelineSpan {
                job: s.job.0,
                job_name: s
                    .label
                    .as_ref()
                    .map_or_else(String::new, |l| l.name.clone()),
                kind: s.label.as_ref().map_or("", |l| l.kind.as_str()).into(),
                lane: s.lane.map(|l| l.0),
                start_seconds_ago: ago(s.start),
                end_seconds_ago: ago(s.end),
                cheap: s.class == RunClass::Cheap,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::timeline::{JobKind, Timeline as Ring};
    use crate::sched::{JobId, LaneId};

    #[test]
    fn windows_must_be_finite_and_not_negative() {
        assert_eq!(window(0.0).unwrap(), None);
        assert_eq!(window(2.5).unwrap(), Some(Duration::from_millis(2500)));
        assert_eq!(window(1e300).unwrap(), Some(Duration::MAX));
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            assert!(
                matches!(window(bad), Err(Error::InvalidArgument(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn spans_are_seconds_before_now_with_their_labels() {
        let started = Instant::now();
        let ring = Ring::new(4);
        ring.open_job(JobId(3), "mnist", JobKind::Graph, None);
        let t0 = Instant::now();
        ring.record(
            JobId(3),
            Some(LaneId(2)),
            t0,
            t0 + Duration::from_millis(10),
            RunClass::Main,
        );
        ring.record(JobId(4), None, t0, t0, RunClass::Cheap);
        std::thread::sleep(Duration::from_millis(20));
        let reply = to_proto(&ring.snapshot(None), started);
        assert_eq!(reply.capacity, 4);
        assert_eq!(reply.recorded_total, 2);
        let main = &reply.spans[0];
        assert_eq!(
            (main.job, main.job_name.as_str(), main.kind.as_str()),
            (3, "mnist", "graph")
        );
        assert_eq!((main.lane, main.cheap), (Some(2), false));
        assert!(main.end_seconds_ago >= 0.01 && main.end_seconds_ago < main.start_seconds_ago);
        assert!((main.start_seconds_ago - main.end_seconds_ago - 0.010).abs() < 1e-6);
        assert!(reply.now_uptime_seconds >= main.start_seconds_ago);
        let cheap = &reply.spans[1];
        assert_eq!(
            (
                cheap.lane,
                cheap.cheap,
                cheap.job_name.as_str(),
                cheap.kind.as_str()
            ),
            (None, true, "", "")
        );
        assert!(reply.now_unix_seconds > 1.6e9);
    }
}
