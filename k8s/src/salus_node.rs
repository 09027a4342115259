//! The node's salus-server, through its admin API: capacity and health, tokens
//! with reservations, and which tenants have jobs. The plugin runs as root on
//! the node, so the server takes it for an admin over loopback.

use std::collections::HashMap;

use salus_proto::salus::v1::admin_client::AdminClient;
use salus_proto::salus::v1::{
    GetServerInfoRequest, IssueTokenRequest, ListJobsRequest, ListTokensRequest,
    RevokeTokensRequest, TenantLimits,
};
use tonic::transport::Channel;

use crate::allocations::TenantJobs;

pub const MIB: u64 = 1 << 20;

/// What one poll reads from the server.
#[derive(Debug, Default)]
pub struct Look {
    /// The device memory the server shares, in MiB.
    pub capacity_mib: u64,
    /// Memory reserved by issued tokens, by tenant (what admission holds for
    /// each: `ctl jobs` shows it as "reserved for").
    pub reserved_bytes: HashMap<String, u64>,
    /// Each tenant's jobs, open now and (for tenants with reservations, as
    /// all of the plugin's have) started so far.
    pub jobs: HashMap<String, TenantJobs>,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cannot reach salus-server at {0}: {1}")]
    Unreachable(String, String),
    #[error("salus-server at {0} shares no device memory: start it with --memory-capacity")]
    NoCapacity(String),
    #[error("salus-server at {0}: {1}")]
    Refused(String, tonic::Status),
}

/// A token just issued.
pub struct Issued {
    pub token: String,
    pub id: String,
}

#[derive(Clone)]
pub struct Node {
    pub address: String,
}

impl Node {
    async fn admin(&self) -> Result<AdminClient<Channel>, NodeError> {
        let url = format!("http://{}", self.address);
        let unreachable =
            |e: &dyn std::fmt::Display| NodeError::Unreachable(self.address.clone(), e.to_string());
        let endpoint = Channel::from_shared(url)
            .map_err(|e| unreachable(&e))?
            .connect_timeout(std::time::Duration::from_secs(3))
            .timeout(std::time::Duration::from_secs(10));
        let channel = endpoint.connect().await.map_err(|e| unreachable(&e))?;
        Ok(AdminClient::new(channel))
    }

    fn refused(&self, status: tonic::Status) -> NodeError {
        if status.code() == tonic::Code::Unavailable {
            NodeError::Unreachable(self.address.clone(), status.message().to_string())
        } else {
            NodeError::Refused(self.address.clone(), status)
        }
    }

    /// Capacity, reservations and jobs, over one connection.
    pub async fn look(&self) -> Result<Look, NodeError> {
        let mut admin = self.admin().await?;
        let info = admin
            .get_server_info(GetServerInfoRequest {})
            .await
            .map_err(|s| self.refused(s))?
            .into_inner();
        if info.memory_capacity_bytes == 0 {
            return Err(NodeError::NoCapacity(self.address.clone()));
        }
        let listed = admin
            .list_jobs(ListJobsRequest {})
            .await
            .map_err(|s| self.refused(s))?
            .into_inner();
        let mut look = Look {
            capacity_mib: info.memory_capacity_bytes / MIB,
            ..Look::default()
        };
        for job in listed.jobs {
            look.jobs.entry(job.tenant).or_default().open += 1;
        }
        // A server older than jobs_started sends 0: only open jobs count then.
        for r in listed.reservations {
            look.jobs.entry(r.tenant.clone()).or_default().started = r.jobs_started;
            *look.reserved_bytes.entry(r.tenant).or_default() += r.reserved_bytes;
        }
        Ok(look)
    }

    /// A token for `tenant` reserving `mib` MiB (its jobs' cap too).
    pub async fn issue(
        &self,
        tenant: &str,
        mib: u64,
        expires_seconds: u64,
    ) -> Result<Issued, NodeError> {
        let issued = self
            .admin()
            .await?
            .issue_token(IssueTokenRequest {
                tenant: tenant.to_string(),
                uid: None,
                limits: Some(TenantLimits {
                    memory_bytes: Some(mib * MIB),
                    ..Default::default()
                }),
                expires_seconds: expires_seconds as f64,
            })
            .await
            .map_err(|s| self.refused(s))?
            .into_inner();
        Ok(Issued {
            token: issued.token,
            id: issued.info.map(|i| i.id).unwrap_or_default(),
        })
    }

    /// Revokes a token; one already gone (revoked, expired) is no error.
    pub async fn revoke(&self, token_id: &str) -> Result<(), NodeError> {
        match self
            .admin()
            .await?
            .revoke_tokens(RevokeTokensRequest {
                id: token_id.to_string(),
                ..Default::default()
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == tonic::Code::InvalidArgument => Ok(()),
            Err(s) => Err(self.refused(s)),
        }
    }

    /// The tenants of the tokens the server holds whose name starts with `prefix`,
    /// with their ids: what a restarted plugin adopts.
    pub async fn tokens_with_prefix(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, String)>, NodeError> {
        let tokens = self
            .admin()
            .await?
            .list_tokens(ListTokensRequest {})
            .await
            .map_err(|s| self.refused(s))?
            .into_inner()
            .tokens;
        Ok(tokens
            .into_iter()
            .filter(|t| t.tenant.starts_with(prefix))
            .map(|t| (t.id, t.tenant))
            .collect())
    }
}
