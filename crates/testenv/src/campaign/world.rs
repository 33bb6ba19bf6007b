//! What a campaign acts on: the cluster (control plane, nodes, process-backed pods), the
//! object store, and the operator as a process of its own.

use super::operator::OperatorProcess;
use crate::{Cluster, Error, PodRunner, S3Server};

pub struct World {
    /// Process-backed pods ([`crate::PodBacking::Processes`]); the API server is restarted.
    pub cluster: &'static Cluster,
    /// Stopped and started again: the campaign's own.
    pub store: &'static S3Server,
    /// An administrator's client.
    pub client: kube::Client,
    /// The campaign's namespace, which the operator watches.
    pub namespace: String,
    pub operator: OperatorProcess,
}

impl World {
    pub fn runner(&self) -> Result<&'static PodRunner, Error> {
        self.cluster.pod_runner().ok_or_else(|| {
            Error::Process("the campaign needs process-backed pods (PodBacking::Processes)".into())
        })
    }
}
