//! The operator's own names, shared by the install manifests, the webhooks and the
//! controllers. One module that each of them imports, so none has to import another for a
//! constant (the manifests generate the webhook configurations; the webhooks name what the
//! manifests install).

/// Namespace the operator runs in.
pub const NAMESPACE: &str = "devctl-system";
/// Name of the ServiceAccount, ClusterRole, ClusterRoleBinding and Deployment, and of the
/// Role and RoleBinding in each watched namespace.
pub const NAME: &str = "devctl-operator";
/// Field manager of `devctl operator install`.
pub const INSTALL_FIELD_MANAGER: &str = "devctl-install";
/// The operator image built from this version.
pub const DEFAULT_IMAGE: &str = concat!(
    "ghcr.io/devctl/devctl-operator:v",
    env!("CARGO_PKG_VERSION")
);
/// The field manager of everything the operator writes (children and status).
pub const FIELD_MANAGER: &str = "devctl-operator";
