//! Device names of a remote-eager job: the client names the server's devices by
//! the job its cluster spec gives the server (`/job:worker/replica:0/task:0/...`),
//! while the server's TFE context names them `/job:localhost/replica:0/task:0/...`.
//! Op devices and node devices inside FunctionDefs are mapped one way, handle
//! devices in responses the other.

/// The job, replica and task of this server's local TFE context.
const LOCAL_JOB: &str = "localhost";

/// Why an op's device cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error(
        "device {device:?} is on job {job:?}, the client's own job; the Salus server cannot reach the client's \
         devices. Run the op on the server (the default once connected), or outside the remote context"
    )]
    ClientJob { device: String, job: String },
    #[error(
        "device {device:?} names job {job:?}, which is not this server (it serves /job:{server}/replica:{replica}/task:{task})"
    )]
    UnknownJob {
        device: String,
        job: String,
        server: String,
        replica: i32,
        task: i32,
    },
}

/// How one client names this server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNames {
    job: String,
    replica: i32,
    task: i32,
    /// The cluster's other jobs (the client's own, `localhost` by default).
    other_jobs: Vec<String>,
    /// GPU lanes: every GPU the client names is this virtual GPU of the server.
    gpu_lane: Option<u32>,
}

/// A parsed `/job:J/replica:R/task:T/rest` name; `rest` keeps the device part
/// as written (`device:CPU:0`, legacy `cpu:0`).
struct Parsed<'a> {
    job: Option<&'a str>,
    replica: Option<&'a str>,
    task: Option<&'a str>,
    rest: Vec<&'a str>,
}

fn parse(name: &str) -> Parsed<'_> {
    let mut parsed = Parsed {
        job: None,
        replica: None,
        task: None,
        rest: Vec::new(),
    };
    for part in name.split('/').filter(|p| !p.is_empty()) {
        if let Some(job) = part.strip_prefix("job:") {
            parsed.job = Some(job);
        } else if let Some(replica) = part.strip_prefix("replica:") {
            parsed.replica = Some(replica);
        } else if let Some(task) = part.strip_prefix("task:") {
            parsed.task = Some(task);
        } else {
            parsed.rest.push(part);
        }
    }
    parsed
}

impl DeviceNames {
    pub fn new(job: &str, replica: i32, task: i32, other_jobs: Vec<String>) -> DeviceNames {
        DeviceNames {
            job: job.to_string(),
            replica,
            task,
            other_jobs: other_jobs.into_iter().filter(|j| j != job).collect(),
            gpu_lane: None,
        }
    }

    /// With GPU lanes, the job's GPU ops run on its lane's virtual GPU.
    pub fn with_gpu_lane(mut self, lane: Option<u32>) -> DeviceNames {
        self.gpu_lane = lane;
        self
    }

    /// A device part (`device:GPU:1`, `gpu:1`) on the job's lane GPU, if it is a GPU.
    fn lane_part(&self, part: &str) -> Option<String> {
        let lane = self.gpu_lane?;
        let lower = part.to_ascii_lowercase();
        let kind = lower.strip_prefix("device:").unwrap_or(&lower);
        kind.starts_with("gpu")
            .then(|| format!("device:GPU:{lane}"))
    }

    /// `name` with its GPU part moved to the job's lane GPU (`None`: unchanged).
    fn on_lane(&self, name: &str) -> Option<String> {
        self.gpu_lane?;
        let mut changed = false;
        let parts: Vec<String> = name
            .split('/')
            .map(|part| match self.lane_part(part) {
                Some(p) => {
                    changed = true;
                    p
                }
                None => part.to_string(),
            })
            .collect();
        changed.then(|| parts.join("/"))
    }

    /// The client's prefix for this server, e.g. `/job:worker/replica:0/task:0`.
    pub fn client_prefix(&self) -> String {
        format!(
            "/job:{}/replica:{}/task:{}",
            self.job, self.replica, self.task
        )
    }

    fn is_this_server(&self, parsed: &Parsed<'_>) -> bool {
        parsed.job == Some(self.job.as_str())
            && parsed.replica.is_none_or(|r| r == self.replica.to_string())
            && parsed.task.is_none_or(|t| t == self.task.to_string())
    }

    fn local(&self, parsed: &Parsed<'_>) -> String {
        let mut out = format!("/job:{LOCAL_JOB}/replica:0/task:0");
        for part in &parsed.rest {
            out.push('/');
            out.push_str(&self.lane_part(part).unwrap_or_else(|| part.to_string()));
        }
        out
    }

    /// The local name of an op's device. Names without a job (`/device:GPU:0`)
    /// are local already; a device on the client's job cannot be served.
    pub fn to_local(&self, name: &str) -> Result<String, DeviceError> {
        let parsed = parse(name);
        match parsed.job {
            None => Ok(self.on_lane(name).unwrap_or_else(|| name.to_string())),
            Some(_) if self.is_this_server(&parsed) => Ok(self.local(&parsed)),
            Some(job) if self.other_jobs.iter().any(|j| j == job) => Err(DeviceError::ClientJob {
                device: name.to_string(),
                job: job.to_string(),
            }),
            Some(job) => Err(DeviceError::UnknownJob {
                device: name.to_string(),
                job: job.to_string(),
                server: self.job.clone(),
                replica: self.replica,
                task: self.task,
            }),
        }
    }

    /// The local name of a node's device inside a function. A function runs
    /// whole on the server, so nodes the client placed on its own job run here
    /// too (`None`: keep the name as it is).
    pub fn node_to_local(&self, name: &str) -> Option<String> {
        let parsed = parse(name);
        let Some(job) = parsed.job else {
            return self.on_lane(name);
        };
        if job == LOCAL_JOB
            && parsed.replica.is_none_or(|r| r == "0")
            && parsed.task.is_none_or(|t| t == "0")
        {
            // Already local (or the client's localhost job, which also maps here).
            let partial = parsed.replica.is_none() || parsed.task.is_none();
            return if partial {
                Some(self.local(&parsed))
            } else {
                self.on_lane(name)
            };
        }
        (self.is_this_server(&parsed) || self.other_jobs.iter().any(|j| j == job))
            .then(|| self.local(&parsed))
    }

    /// The client's name for a device of the local context.
    pub fn to_client(&self, local: &str) -> String {
        let parsed = parse(local);
        if parsed.job.is_some_and(|j| j != LOCAL_JOB) {
            return local.to_string();
        }
        let mut out = self.client_prefix();
        for part in &parsed.rest {
            out.push('/');
            // The client asked for its GPU:0; the lane's GPU is that one to it.
            match self.lane_part(part) {
                Some(_) => out.push_str("device:GPU:0"),
                None => out.push_str(part),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> DeviceNames {
        DeviceNames::new("worker", 0, 0, vec!["worker".into(), "localhost".into()])
    }

    #[test]
    fn maps_the_servers_job_to_the_local_context_and_back() {
        let n = names();
        let local = n
            .to_local("/job:worker/replica:0/task:0/device:CPU:0")
            .unwrap();
        assert_eq!(local, "/job:localhost/replica:0/task:0/device:CPU:0");
        assert_eq!(
            n.to_client(&local),
            "/job:worker/replica:0/task:0/device:CPU:0"
        );
        assert_eq!(
            n.to_local("/job:worker/device:GPU:1").unwrap(),
            "/job:localhost/replica:0/task:0/device:GPU:1"
        );
        assert_eq!(n.to_local("/device:CPU:0").unwrap(), "/device:CPU:0");
        assert_eq!(n.to_local("").unwrap(), "");
    }

    #[test]
    fn refuses_devices_of_other_jobs_and_tasks() {
        let n = names();
        assert!(matches!(
            n.to_local("/job:localhost/replica:0/task:0/device:CPU:0"),
            Err(DeviceError::ClientJob { job, .. }) if job == "localhost"
        ));
        assert!(matches!(
            n.to_local("/job:ps/task:0/device:CPU:0"),
            Err(DeviceError::UnknownJob { .. })
        ));
        assert!(matches!(
            n.to_local("/job:worker/replica:0/task:1/device:CPU:0"),
            Err(DeviceError::UnknownJob { .. })
        ));
    }

    #[test]
    fn gpu_lanes_move_gpu_devices_to_the_lane() {
        let n = names().with_gpu_lane(Some(2));
        assert_eq!(
            n.to_local("/job:worker/replica:0/task:0/device:GPU:0")
                .unwrap(),
            "/job:localhost/replica:0/task:0/device:GPU:2"
        );
        assert_eq!(n.to_local("/device:GPU:1").unwrap(), "/device:GPU:2");
        assert_eq!(
            n.to_local("/job:worker/replica:0/task:0/device:CPU:0")
                .unwrap(),
            "/job:localhost/replica:0/task:0/device:CPU:0"
        );
        assert_eq!(
            n.node_to_local("/device:GPU:0").as_deref(),
            Some("/device:GPU:2")
        );
        assert_eq!(n.node_to_local("/device:CPU:0"), None);
        assert_eq!(
            n.to_client("/job:localhost/replica:0/task:0/device:GPU:2"),
            "/job:worker/replica:0/task:0/device:GPU:0"
        );
    }

    #[test]
    fn function_nodes_run_on_the_server() {
        let n = names();
        assert_eq!(
            n.node_to_local("/job:worker/replica:0/task:0/device:CPU:0")
                .as_deref(),
            Some("/job:localhost/replica:0/task:0/device:CPU:0")
        );
        assert_eq!(
            n.node_to_local("/job:localhost/device:CPU:0").as_deref(),
            Some("/job:localhost/replica:0/task:0/device:CPU:0")
        );
        assert_eq!(
            n.node_to_local("/job:localhost/replica:0/task:0/device:CPU:0"),
            None
        );
        assert_eq!(n.node_to_local("/device:GPU:0"), None);
        assert_eq!(n.node_to_local(""), None);
    }
}
