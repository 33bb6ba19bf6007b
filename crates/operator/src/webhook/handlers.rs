//! The webhooks' request handling, bytes in and bytes out (pure, so it is tested without a
//! server and fuzzed with malformed bodies): every body — even garbage — gets a well-formed
//! `AdmissionReview` or `ConversionReview` answer the API server can read.

use devctl_api::database_cluster::admission::{self, AdmissionSettings};
use devctl_api::database_cluster::{DatabaseCluster, FINALIZER, conversion};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};
use kube::core::{DynamicObject, Status};

/// `POST /validate-…`: the rules of [`admission::validate`].
pub fn validate(body: &[u8], settings: &AdmissionSettings) -> Vec<u8> {
    respond(body, |request| {
        let response = AdmissionResponse::from(&request);
        let Some(db) = cluster_of(request.object.as_ref()) else {
            // DELETE and CONNECT carry no object; the configuration does not send them.
            return Ok(response);
        };
        let db = db?;
        let old = match (&request.operation, request.old_object.as_ref()) {
            (Operation::Update, Some(old)) => cluster_of(Some(old)).transpose()?,
            _ => None,
        };
        let via_v1alpha1 = request
            .request_kind
            .as_ref()
            .is_some_and(|kind| kind.version == "v1alpha1");
        let running_version = old
            .as_ref()
            .and_then(|o| o.status.as_ref())
            .and_then(|s| s.current_version.as_deref());
        let errors = admission::validate(
            &db.spec,
            admission::Request {
                old: old.as_ref().map(|o| &o.spec),
                running_version,
                via_v1alpha1,
                upgrading: old
                    .as_ref()
                    .and_then(|o| o.status.as_ref())
                    .and_then(|s| s.major_upgrade.as_ref())
                    .is_some_and(|u| !u.step.is_final()),
            },
            settings,
        );
        if errors.is_empty() {
            return Ok(response);
        }
        let message = errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        let mut denied = response.deny(&message);
        denied.result = invalid_status(&message);
        Ok(denied)
    })
}

/// `POST /mutate-…`: the defaults of [`admission::defaults`], and on a create the operator's
/// finalizer, as a JSON patch.
pub fn mutate(body: &[u8]) -> Vec<u8> {
    respond(body, |request| {
        let response = AdmissionResponse::from(&request);
        // Mutation runs before schema validation: an object that does not parse gets no
        // defaults here and the API server's field-level schema error next.
        let Some(Ok(db)) = cluster_of(request.object.as_ref()) else {
            return Ok(response);
        };
        let operations = mutation(&db, &request.operation);
        if operations.is_empty() {
            return Ok(response);
        }
        let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(operations))
            .map_err(|e| format!("building the defaults patch: {e}"))?;
        response
            .with_patch(patch)
            .map_err(|e| format!("building the defaults patch: {e}"))
    })
}

/// `POST /convert`: every object to the desired version ([`conversion::convert`]); one
/// failure fails the whole request, as the API server requires.
pub fn convert(body: &[u8]) -> Vec<u8> {
    let review: ConversionReview = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(error) => {
            return conversion_bytes(
                ConversionResponse::invalid(bad_request(format!(
                    "malformed ConversionReview: {error}"
                )))
                .into_review(),
            );
        }
    };
    let request = match ConversionRequest::from_review(review) {
        Ok(request) => request,
        Err(_) => {
            return conversion_bytes(
                ConversionResponse::invalid(bad_request(
                    "malformed ConversionReview: it has no request".into(),
                ))
                .into_review(),
            );
        }
    };
    let desired = request.desired_api_version.clone();
    let objects = request.objects.clone();
    let response = ConversionResponse::for_request(request);
    let mut converted = Vec::with_capacity(objects.len());
    for object in objects {
        let name = object
            .pointer("/metadata/name")
            .and_then(|n| n.as_str())
            .unwrap_or("<unnamed>")
            .to_string();
        match conversion::convert(object, &desired) {
            Ok(object) => converted.push(object),
            Err(error) => {
                let status = Status::failure(
                    &format!("converting DatabaseCluster {name} to {desired}: {error}"),
                    "Invalid",
                )
                .with_code(422);
                return conversion_bytes(response.failure(status).into_review());
            }
        }
    }
    conversion_bytes(response.success(converted).into_review())
}

/// The review as the API server expects it back, whatever the request called itself.
fn conversion_bytes(mut review: ConversionReview) -> Vec<u8> {
    review.types = kube::core::TypeMeta {
        api_version: "apiextensions.k8s.io/v1".into(),
        kind: "ConversionReview".into(),
    };
    to_bytes(&review)
}

/// Parses the review, runs `decide` on its request, and serializes the answer; a body that
/// is not a review gets an `AdmissionReview` with `allowed: false` and why.
fn respond(
    body: &[u8],
    decide: impl FnOnce(AdmissionRequest<DynamicObject>) -> Result<AdmissionResponse, String>,
) -> Vec<u8> {
    let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(error) => {
            return to_bytes(
                &AdmissionResponse::invalid(format!("malformed AdmissionReview: {error}"))
                    .into_review(),
            );
        }
    };
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(_) => {
            return to_bytes(
                &AdmissionResponse::invalid("malformed AdmissionReview: it has no request")
                    .into_review(),
            );
        }
    };
    let fallback = AdmissionResponse::from(&request);
    let response = match decide(request) {
        Ok(response) => response,
        Err(message) => {
            let mut denied = fallback.deny(&message);
            denied.result = invalid_status(&message);
            denied
        }
    };
    let mut review = response.into_review();
    review.types = kube::core::TypeMeta {
        api_version: kube::core::admission::META_API_VERSION_V1.into(),
        kind: kube::core::admission::META_KIND.into(),
    };
    to_bytes(&review)
}

/// What the mutating webhook changes in `db` for this operation, as JSON Patch operations
/// (RFC 6902): the engine's defaults, and on a create the finalizer.
pub fn mutation(db: &DatabaseCluster, operation: &Operation) -> Vec<serde_json::Value> {
    let mut operations = admission::defaults(&db.spec);
    if *operation == Operation::Create {
        operations.extend(finalizer(db));
    }
    operations
}

/// The operation that adds the operator's finalizer to a new cluster, unless it has it.
///
/// The reconciler adds it too (the webhooks are optional), but a cluster admitted with it
/// saves the first reconcile one write. The configuration sends only the namespaces this
/// operator watches, so no cluster outside them is held by it.
fn finalizer(db: &DatabaseCluster) -> Option<serde_json::Value> {
    let value = serde_json::Value::from(FINALIZER);
    match db.metadata.finalizers.as_deref() {
        Some(finalizers) if finalizers.iter().any(|f| f == FINALIZER) => None,
        Some(_) => Some(
            serde_json::json!({ "op": "add", "path": "/metadata/finalizers/-", "value": value }),
        ),
        None => Some(
            serde_json::json!({ "op": "add", "path": "/metadata/finalizers", "value": [value] }),
        ),
    }
}

/// The DatabaseCluster in a request (`None` when there is no object).
fn cluster_of(object: Option<&DynamicObject>) -> Option<Result<DatabaseCluster, String>> {
    let object = object?;
    Some(
        serde_json::to_value(object)
            .and_then(serde_json::from_value::<DatabaseCluster>)
            .map_err(|e| format!("spec: {e}")),
    )
}

fn invalid_status(message: &str) -> Status {
    Status::failure(message, "Invalid").with_code(422)
}

fn bad_request(message: String) -> Status {
    Status::failure(&message, "BadRequest").with_code(400)
}

fn to_bytes<T: serde::Serialize>(value: &T) -> Vec<u8> {
    // Infallible: reviews are plain data with string keys.
    serde_json::to_vec(value).unwrap_or_else(|error| {
        format!(r#"{{"kind":"Status","apiVersion":"v1","status":"Failure","message":"serializing the response: {error}","code":500}}"#)
            .into_bytes()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    fn review(operation: &str, object: Value, old: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": { "group": "db.devctl.io", "version": "v1beta1", "kind": "DatabaseCluster" },
                "resource": { "group": "db.devctl.io", "version": "v1beta1", "resource": "databaseclusters" },
                "name": "pg", "namespace": "default", "operation": operation,
                "userInfo": { "username": "admin" },
                "object": object, "oldObject": old, "dryRun": false,
            }
        }))
        .unwrap()
    }

    fn cluster(spec: Value) -> Value {
        json!({ "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
                "metadata": { "name": "pg", "namespace": "default" }, "spec": spec })
    }

    fn response(bytes: &[u8]) -> Value {
        let value: Value = serde_json::from_slice(bytes).expect("a JSON response");
        assert_eq!(value["kind"], "AdmissionReview", "{value}");
        value["response"].clone()
    }

    #[test]
    fn a_downgrade_is_denied_with_the_field_and_the_uid() {
        let old =
            cluster(json!({ "version": "16.4", "replicas": 1, "storage": { "size": "1Gi" } }));
        let new =
            cluster(json!({ "version": "16.2", "replicas": 1, "storage": { "size": "1Gi" } }));
        let answer = response(&validate(
            &review("UPDATE", new, old),
            &AdmissionSettings::default(),
        ));
        assert_eq!(answer["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(answer["allowed"], false);
        assert_eq!(answer["status"]["code"], 422);
        assert!(
            answer["status"]["message"]
                .as_str()
                .unwrap()
                .starts_with("spec.version: downgrade from 16.4 to 16.2")
        );
    }

    #[test]
    fn defaults_come_as_a_json_patch() {
        let new = cluster(
            json!({ "engine": "mysql", "version": "8.0", "replicas": 1, "storage": { "size": "1Gi" } }),
        );
        let answer = response(&mutate(&review("CREATE", new, Value::Null)));
        assert_eq!(answer["allowed"], true);
        assert_eq!(answer["patchType"], "JSONPatch");
        let patch = patch_of(&answer);
        assert_eq!(patch[0]["path"], "/spec/resources");
    }

    fn patch_of(answer: &Value) -> Value {
        let patch: Vec<u8> = serde_json::from_value(answer["patch"].clone()).unwrap_or_else(|_| {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD
                .decode(answer["patch"].as_str().unwrap())
                .unwrap()
        });
        serde_json::from_slice(&patch).unwrap()
    }

    #[test]
    fn a_create_gets_the_finalizer_once_and_an_update_none() {
        let spec = json!({ "engine": "postgres", "version": "16.2", "storage": { "size": "1Gi" },
                           "resources": { "requests": { "cpu": "1", "memory": "1Gi" } } });
        let answer = response(&mutate(&review(
            "CREATE",
            cluster(spec.clone()),
            Value::Null,
        )));
        assert_eq!(
            patch_of(&answer),
            json!([{ "op": "add", "path": "/metadata/finalizers", "value": [FINALIZER] }])
        );

        let mut other = cluster(spec.clone());
        other["metadata"]["finalizers"] = json!(["example.com/keep"]);
        let answer = response(&mutate(&review("CREATE", other, Value::Null)));
        assert_eq!(
            patch_of(&answer),
            json!([{ "op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER }])
        );

        let mut ours = cluster(spec.clone());
        ours["metadata"]["finalizers"] = json!([FINALIZER]);
        let answer = response(&mutate(&review("CREATE", ours, Value::Null)));
        assert!(answer.get("patch").is_none_or(Value::is_null), "{answer}");

        // Updates are the reconciler's: an object being deleted may gain no finalizer, and a
        // spec change of one must still be admitted.
        let answer = response(&mutate(&review(
            "UPDATE",
            cluster(spec.clone()),
            cluster(spec),
        )));
        assert!(answer.get("patch").is_none_or(Value::is_null), "{answer}");
    }

    #[test]
    fn a_conversion_failure_names_the_object() {
        let body = serde_json::to_vec(&json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": { "uid": "u1", "desiredAPIVersion": "db.devctl.io/v1alpha1",
                "objects": [cluster(json!({ "version": 16 }))] }
        }))
        .unwrap();
        let answer: Value = serde_json::from_slice(&convert(&body)).unwrap();
        assert_eq!(answer["response"]["uid"], "u1");
        assert_eq!(answer["response"]["result"]["status"], "Failure");
        assert!(
            answer["response"]["result"]["message"]
                .as_str()
                .unwrap()
                .contains("DatabaseCluster pg")
        );
    }

    fn mangled() -> impl Strategy<Value = Vec<u8>> {
        let valid = review(
            "UPDATE",
            cluster(json!({ "version": "16.2", "replicas": 3, "storage": { "size": "1Gi" } })),
            cluster(json!({ "version": "16.2", "replicas": 3, "storage": { "size": "1Gi" } })),
        );
        let conversion = serde_json::to_vec(&json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": { "uid": "u", "desiredAPIVersion": "db.devctl.io/v1alpha1",
                "objects": [cluster(json!({ "version": "16.2", "storage": { "size": "1Gi" } }))] }
        }))
        .unwrap();
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..256),
            // Valid reviews cut short or with bytes flipped.
            (0..valid.len()).prop_map(move |n| valid[..n].to_vec()),
            (0..conversion.len(), any::<u8>()).prop_map(move |(i, b)| {
                let mut body = conversion.clone();
                body[i] = b;
                body
            }),
            "[{}\\[\\]\":,a-z0-9 ]{0,80}".prop_map(String::into_bytes),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn malformed_bodies_get_a_well_formed_answer(body in mangled()) {
            for answer in [validate(&body, &AdmissionSettings::default()), mutate(&body)] {
                let value: Value = serde_json::from_slice(&answer).unwrap();
                prop_assert_eq!(&value["kind"], "AdmissionReview");
                prop_assert!(value["response"]["allowed"].is_boolean());
                if value["response"]["allowed"] == false {
                    prop_assert!(!value["response"]["status"]["message"].as_str().unwrap_or_default().is_empty());
                }
            }
            let value: Value = serde_json::from_slice(&convert(&body)).unwrap();
            prop_assert_eq!(&value["kind"], "ConversionReview");
            prop_assert!(value["response"]["result"].is_object());
        }
    }
}
