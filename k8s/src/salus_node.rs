//! The node's salus-server, through its admin API: capacity and health, tokens
//! with reservations, and which tenants have jobs. The plugin runs as root on
//! the node, so the server takes it for an admin over loopback.

use std::collections::HashSet;

use salus_proto::salus::v1::admin_client::AdminClient;
use salus_proto::salus::v1::{
    GetServerInfoRequest, IssueTokenRequest, ListJobsRequest, ListTokensRequest,
    RevokeTokensRequest, TenantLimits,
};
use tonic::transport::Channel;

const MIB: u64 = 1 << 20;

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

    /// The device memory the server shares, in MiB.
    pub async fn capacity_mib(&self) -> Result<u64, NodeError> {
        let info = self
            .admin()
            .await?
            .get_server_info(GetServerInfoRequest {})
            .await
            .map_err(|s| self.refused(s))?
            .into_inner();
        if info.memory_capacity_bytes == 0 {
            return Err(NodeError::NoCapacity(self.address.clone()));
        }
        Ok(info.memory_capacity_bytes / MIB)
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
                which: token_id.to_string(),
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

    /// The tenants that have a job open on the server now.
    pub async fn tenants_with_jobs(&self) -> Result<HashSet<String>, NodeError> {
        let jobs = self
            .admin()
            .await?
            .list_jobs(ListJobsRequest {})
            .await
            .map_err(|s| self.refused(s))?
            .into_inner()
            .jobs;
        Ok(jobs.into_iter().map(|j| j.tenant).collect())
    }
}
