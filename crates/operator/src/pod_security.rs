//! Security contexts that pass Pod Security Standards `restricted`, for every pod devctl
//! creates.

use serde_json::{Value, json};

/// Container security context: no privilege escalation, all capabilities dropped, non-root,
/// the runtime's default seccomp profile.
pub fn restricted_container() -> Value {
    json!({
        "allowPrivilegeEscalation": false,
        "capabilities": { "drop": ["ALL"] },
        "runAsNonRoot": true,
        "seccompProfile": { "type": "RuntimeDefault" },
    })
}

/// Pod security context; `uid` pins user, group and fsGroup (volumes become writable by it).
pub fn restricted_pod(uid: Option<i64>) -> Value {
    let mut context = json!({
        "runAsNonRoot": true,
        "seccompProfile": { "type": "RuntimeDefault" },
    });
    if let Some(uid) = uid {
        context["runAsUser"] = json!(uid);
        context["runAsGroup"] = json!(uid);
        context["fsGroup"] = json!(uid);
    }
    context
}
