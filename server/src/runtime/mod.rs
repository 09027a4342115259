//! The job runtime under the front ends: the tables of jobs, one TF_Session
//! job (graph), one TFE context job (eager), and what they share (scheduling on executor lanes, memory admission,
//! run classification, memory estimates).

pub mod admission;
pub mod device_list;
pub mod eager_devices;
pub mod eager_functions;
pub mod eager_items;
pub mod eager_job;
pub mod exec;
pub mod executor;
pub mod graph_delta;
pub mod graph_job;
pub mod grants;
pub mod job_history;
pub mod job_memory;
pub mod job_open;
pub mod job_source;
pub mod jobs;
pub mod latency;
pub mod main_iteration;
pub mod memory_profile;
pub mod node;
pub mod python_calls;
pub mod rendezvous;
pub mod report;
pub mod run_class;
pub mod run_errors;
pub mod run_stats;
pub mod saved_hints;
pub mod sched_port;
pub mod session_config;
pub mod settings;
pub mod stall_fault;
pub mod state;
pub mod tenant_ids;
pub mod timeline;
