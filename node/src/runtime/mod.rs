//! The runtime's TensorFlow-free parts: the jobs' one way to the scheduler
//! core ([`sched_port`]) and the core itself driven by lane threads
//! ([`executor`]), memory admission, run classes and statistics, the
//! timeline and history, the admin API's rows of jobs. The jobs themselves
//! (TF_Session and TFE context) are salus-server's.

pub mod admission;
pub mod device_list;
pub mod exec;
pub mod executor;
pub mod grants;
pub mod job_history;
pub mod job_source;
pub mod latency;
pub mod memory_profile;
pub mod node;
pub mod report;
pub mod run_class;
pub mod run_errors;
pub mod run_stats;
pub mod saved_hints;
pub mod sched_port;
pub mod session_config;
pub mod settings;
pub mod tenant_ids;
pub mod timeline;
