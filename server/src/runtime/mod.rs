//! The job runtime under the front ends: the tables of jobs, one TF_Session
//! job (graph), one TFE context job (eager), and what they share (scheduling on executor lanes, memory admission,
//! run classification, memory estimates).

pub mod device_list;
pub mod eager_devices;
pub mod eager_functions;
pub mod eager_items;
pub mod eager_job;
pub mod graph_delta;
pub mod graph_job;
pub mod job_memory;
pub mod job_open;
pub mod jobs;
pub mod local_jobs;
pub mod main_iteration;
pub mod memory_profile;
pub mod python_calls;
pub mod rendezvous;
pub mod stall_fault;
pub mod state;

// The TensorFlow-free parts, from salus-node under the same paths (device_list
// and memory_profile re-export theirs and add what runs TensorFlow).
pub use salus_node::runtime::{
    admission, exec, executor, grants, job_history, job_source, latency, node, report, run_class, run_errors,
    run_stats, saved_hints, sched_port, session_config, settings, tenant_ids, timeline,
};
