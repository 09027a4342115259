//! The main iteration: the one path every run of a job takes, whatever front
//! end it came from. A TF1 `RunStep`/`RunCallable` (on the async runtime,
//! [`Iterations::run`]) and a TF2 function call (on its eager job's own thread,
//! [`Iterations::run_here`]) go through the same steps:
//!
//! 1. refused once shutdown began ([`Iterations::begin`]);
//! 2. the class resolved by the scheduler (a brief run queues only when
//!    another job's iteration ranks ahead);
//! 3. cheap: run at once, timed, and the time charged to the job
//!    (`record_cheap_run`);
//! 4. main: the job's fingerprint told before its first; memory admission
//!    gives it a lane before its first ([`Iterations::admit`]); it waits for
//!    its turn on the lane, runs, and its end is told to the job history.
//!
//! The front ends only classify (they know what a run is) and translate.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use salus_proto::tensorflow::error::Code as TfCode;

use crate::error::{Error, Result};
use crate::runtime::admission::Admission;
use crate::runtime::exec;
use crate::runtime::job_history::HistoryFacts;
use crate::runtime::job_memory::JobMemory;
use crate::runtime::run_class::RunClass;
use crate::runtime::sched_port::SchedPort;
use crate::sched::{Hints, JobId};
use crate::tf::TfError;

/// What the main iteration needs of a job (graph or eager).
#[derive(Clone, Copy)]
pub struct IteratingJob<'a> {
    pub id: JobId,
    /// The hints the job was created with (the scheduler keeps the current ones).
    pub created_hints: &'a Hints,
    pub memory: &'a JobMemory,
    pub history: &'a HistoryFacts,
}

impl<'a> IteratingJob<'a> {
    pub fn new(
        id: JobId,
        created_hints: &'a Hints,
        memory: &'a JobMemory,
        history: &'a HistoryFacts,
    ) -> Self {
        IteratingJob {
            id,
            created_hints,
            memory,
            history,
        }
    }
}

/// How a run ended, for the job history: TensorFlow's code if it failed.
pub trait RunOutcome {
    fn failure(&self) -> Option<TfCode>;
}

impl<T> RunOutcome for Result<T> {
    fn failure(&self) -> Option<TfCode> {
        self.as_ref().err().map(Error::code)
    }
}

impl<T> RunOutcome for std::result::Result<T, TfError> {
    fn failure(&self) -> Option<TfCode> {
        self.as_ref()
            .err()
            .map(|e| TfCode::try_from(e.code).unwrap_or(TfCode::Unknown))
    }
}

/// The scheduler, memory admission and the shutdown flag, as runs of every
/// job use them. Cheap to clone.
#[derive(Clone)]
pub struct Iterations {
    pub port: SchedPort,
    /// Memory admission, when a capacity is configured.
    pub admission: Option<Admission>,
    /// Set at shutdown: no new runs (an eager client can still fetch the
    /// results of earlier ones).
    pub draining: Arc<AtomicBool>,
}

impl Iterations {
    /// The job's current hints: the scheduler's (set at run time by the admin
    /// API, capped by the owner's limits where it schedules), else those it
    /// was created with.
    pub fn current_hints(&self, job: IteratingJob<'_>) -> Hints {
        self.port
            .job_status(job.id)
            .map(|s| s.hints)
            .unwrap_or_else(|| job.created_hints.clone())
    }

    /// Steps 1 and 2: refused at shutdown, else the class the scheduler
    /// resolves `class` to (never [`RunClass::Brief`]). Before the job's first
    /// main iteration, the scheduler learns its fingerprint.
    fn begin(
        &self,
        job: IteratingJob<'_>,
        class: RunClass,
        fingerprint: impl FnOnce() -> String,
    ) -> Result<RunClass> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(Error::ShuttingDown);
        }
        let class = self.port.resolve(job.id, class);
        if class == RunClass::Main && job.history.first_main() {
            self.port.set_fingerprint(job.id, &fingerprint());
        }
        Ok(class)
    }

    /// Runs `f` (one run of `job`, classified `class`) off the async runtime:
    /// at once if it is cheap, else as a main iteration when the scheduler
    /// picks it (`deadline`: the client's). `fingerprint`: the job's, asked
    /// for before its first main iteration.
    pub async fn run<T, F>(
        &self,
        job: IteratingJob<'_>,
        class: RunClass,
        deadline: Option<Instant>,
        fingerprint: impl FnOnce() -> String,
        f: F,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T> + Send + 'static,
    {
        match self.begin(job, class, fingerprint)? {
            RunClass::Cheap | RunClass::Brief => {
                let (result, started, ended) = exec::blocking(move || {
                    let started = Instant::now();
                    let result = f();
                    Ok((result, started, Instant::now()))
                })
                .await?;
                self.port.record_cheap_run(job.id, started, ended);
                result
            }
            RunClass::Main => {
                self.admit(job).await?;
                let result = self.port.run_main(job.id, deadline, f).await;
                job.history.main_ended(result.failure());
                result
            }
        }
    }

    /// [`Iterations::run`] on the calling thread, which is off the async
    /// runtime (an eager job's own thread, which owns its TFE context):
    /// admission is awaited on `runtime`, the turn waited for here, and `f`
    /// runs here while the turn is held. The outer error is the scheduler's
    /// or admission's (`f` did not run); `f`'s own outcome is returned as it is.
    pub fn run_here<R: RunOutcome>(
        &self,
        job: IteratingJob<'_>,
        class: RunClass,
        runtime: &tokio::runtime::Handle,
        fingerprint: impl FnOnce() -> String,
        f: impl FnOnce() -> R,
    ) -> Result<R> {
        match self.begin(job, class, fingerprint)? {
            RunClass::Cheap | RunClass::Brief => {
                let started = Instant::now();
                let outcome = f();
                self.port.record_cheap_run(job.id, started, Instant::now());
                Ok(outcome)
            }
            RunClass::Main => {
                runtime.block_on(self.admit(job))?;
                let turn = self.port.wait_turn(job.id, None)?;
                let outcome = f();
                drop(turn);
                job.history.main_ended(outcome.failure());
                Ok(outcome)
            }
        }
    }

    /// Gives the job a memory lane before its first main iteration (when
    /// memory admission is on); waits while memory is short, up to the
    /// admission timeout. The one admission of every job.
    pub async fn admit(&self, job: IteratingJob<'_>) -> Result<()> {
        let Some(admission) = &self.admission else {
            return Ok(());
        };
        let memory = job.memory;
        if memory.lane().is_some() {
            return Ok(());
        }
        let _one_at_a_time = memory.admission_lock.lock().await;
        if memory.lane().is_some() {
            return Ok(());
        }
        let hints = self.current_hints(job);
        let need = memory.estimate(&hints).need;
        let reservation = admission
            .admit(job.id, need, memory.gpu_lane(), hints)
            .await?;
        memory.set_reservation(reservation);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::executor::Executor;
    use crate::runtime::graph_delta::VariableBytes;
    use crate::sched::{policy, LaneId, SchedConfig};

    struct TestJob {
        id: JobId,
        hints: Hints,
        memory: JobMemory,
        history: HistoryFacts,
    }

    impl TestJob {
        fn it(&self) -> IteratingJob<'_> {
            IteratingJob::new(self.id, &self.hints, &self.memory, &self.history)
        }
    }

    fn iterations() -> (Iterations, TestJob) {
        let executor = Executor::new(
            policy::by_name("fair").unwrap(),
            SchedConfig {
                lane_concurrency: 1,
                anticipation: 0,
                ..SchedConfig::default()
            },
        );
        let port = SchedPort::Local(executor);
        let job = TestJob {
            id: JobId(7),
            hints: Hints::default(),
            memory: JobMemory::new("graph", VariableBytes::default(), None),
            history: HistoryFacts::default(),
        };
        port.add_job(job.id, LaneId(0), Hints::default()).unwrap();
        let iterations = Iterations {
            port,
            admission: None,
            draining: Arc::new(AtomicBool::new(false)),
        };
        (iterations, job)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cheap_runs_go_at_once_and_are_counted() {
        let (iterations, job) = iterations();
        let out = iterations
            .run(job.it(), RunClass::Cheap, None, || unreachable!(), || Ok(5))
            .await
            .unwrap();
        assert_eq!(out, 5);
        assert_eq!(iterations.port.cheap_runs(job.id), 1);
        // A cheap run is not a main iteration: the fingerprint is still due.
        assert!(job.history.first_main());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_main_iteration_tells_the_fingerprint_once_and_records_its_end() {
        let (iterations, job) = iterations();
        let mut told = 0;
        let failed: Result<()> = iterations
            .run(
                job.it(),
                RunClass::Main,
                None,
                || {
                    told += 1;
                    "g0".into()
                },
                || Err(Error::InvalidArgument("bad feed".into())),
            )
            .await;
        assert!(failed.is_err());
        assert_eq!(told, 1);
        assert_eq!(job.history.end_when_closed(), crate::sched::RunEnd::Failed);
        assert_eq!(iterations.port.cheap_runs(job.id), 0);
        // The second: no fingerprint again; a success ends the run as completed.
        let ok = iterations
            .run(job.it(), RunClass::Main, None, || unreachable!(), || Ok(()))
            .await;
        assert!(ok.is_ok());
        assert_eq!(
            job.history.end_when_closed(),
            crate::sched::RunEnd::Completed
        );
    }

    #[tokio::test]
    async fn shutdown_refuses_runs_before_they_start() {
        let (iterations, job) = iterations();
        iterations.draining.store(true, Ordering::SeqCst);
        let refused = iterations
            .run(
                job.it(),
                RunClass::Cheap,
                None,
                || unreachable!(),
                || -> Result<()> { unreachable!("a run started at shutdown") },
            )
            .await;
        assert!(matches!(refused, Err(Error::ShuttingDown)));
    }

    #[test]
    fn a_job_thread_runs_its_main_iteration_in_its_turn() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let (iterations, job) = iterations();
        let outcome = iterations
            .run_here(
                job.it(),
                RunClass::Main,
                runtime.handle(),
                || "f1".into(),
                || -> std::result::Result<u32, TfError> {
                    Err(TfError::new(TfCode::OutOfRange as i32, "end of input"))
                },
            )
            .unwrap();
        assert!(outcome.is_err());
        // The end of the input is how a dataset loop stops: not a failure.
        assert_eq!(
            job.history.end_when_closed(),
            crate::sched::RunEnd::Completed
        );
        let cheap = iterations
            .run_here(
                job.it(),
                RunClass::Brief,
                runtime.handle(),
                || unreachable!(),
                || std::result::Result::<u32, TfError>::Ok(1),
            )
            .unwrap();
        assert_eq!(cheap.unwrap(), 1);
        assert_eq!(iterations.port.cheap_runs(job.id), 1);
    }
}
