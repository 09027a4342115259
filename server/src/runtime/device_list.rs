//! The devices every job sees: the probe's list (salus-node's
//! `runtime::device_list`, re-exported here), and the listing itself, which
//! runs TensorFlow in this process.

use std::sync::Arc;

pub use salus_node::runtime::device_list::*;

use crate::error::Result;
use crate::runtime::exec;
use crate::runtime::session_config::{session_config, SessionDefaults};
use crate::tf::{self, Graph, Session};

/// Lists the devices in this process (off the async runtime).
pub async fn list_here(defaults: SessionDefaults) -> Result<DeviceList> {
    let (probe_config, _) = session_config(&[], defaults)?;
    let devices = exec::blocking(move || {
        let probe = Session::new(Arc::new(Graph::new()), &probe_config)?;
        Ok(probe.list_devices()?)
    })
    .await?;
    Ok(DeviceList {
        devices,
        tensorflow_version: tf::tensorflow_version(),
    })
}
