//! Decoding watched objects without the fields the operator would drop at once.
//!
//! Every watch event and list page is decoded into a k8s-openapi struct before the caches
//! slim it. Decoding what is then thrown away is most of the allocation work of an operator
//! that watches thousands of objects: `metadata.managedFields` (a JSON tree per field
//! manager) on every object, a pod's whole spec. [`Lean<K, S>`] decodes `K` through a
//! deserializer that passes over the fields [`S::SKIP`](SkipFields::SKIP) names: they are
//! still parsed (the JSON must be valid) but nothing is allocated for them. The fields left
//! out must be ones the cache would have removed anyway, so what is cached is the same.
//!
//! Only the objects and maps on the named paths are looked at; every other value is decoded
//! by serde_json as before, at its usual speed.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

/// A field to leave out while decoding: its whole value (`inside: None`), or only the fields
/// `inside` names within it.
#[derive(Debug)]
pub struct Skip {
    pub key: &'static str,
    pub inside: Option<&'static [Skip]>,
}

/// The fields a kind's cache never keeps.
pub trait SkipFields: 'static {
    const SKIP: &'static [Skip];
}

const MANAGED_FIELDS: Skip = Skip {
    key: "managedFields",
    inside: None,
};

/// Every kind: the field managers' records, which no cache keeps (the server-side apply
/// bookkeeping is the server's).
pub struct ManagedFields;

impl SkipFields for ManagedFields {
    const SKIP: &'static [Skip] = &[Skip {
        key: "metadata",
        inside: Some(&[MANAGED_FIELDS]),
    }];
}

/// Pods: the spec and the metadata the pod cache drops
/// ([`trim_pod`](crate::database_cluster::trim_pod)).
pub struct PodFields;

impl SkipFields for PodFields {
    const SKIP: &'static [Skip] = &[
        Skip {
            key: "metadata",
            inside: Some(&[
                MANAGED_FIELDS,
                Skip {
                    key: "ownerReferences",
                    inside: None,
                },
                Skip {
                    key: "finalizers",
                    inside: None,
                },
            ]),
        },
        Skip {
            key: "spec",
            inside: None,
        },
    ];
}

/// Volume claims: the metadata the claim cache drops
/// ([`persistent_volume_claim`](crate::children::slim::persistent_volume_claim)).
pub struct ClaimFields;

impl SkipFields for ClaimFields {
    const SKIP: &'static [Skip] = &[Skip {
        key: "metadata",
        inside: Some(&[
            MANAGED_FIELDS,
            Skip {
                key: "annotations",
                inside: None,
            },
            Skip {
                key: "ownerReferences",
                inside: None,
            },
            Skip {
                key: "finalizers",
                inside: None,
            },
        ]),
    }];
}

/// `K` decoded without the fields `S` names; the API, URL and metadata are `K`'s.
pub struct Lean<K, S>(pub K, PhantomData<fn() -> S>);

impl<K: Clone, S> Clone for Lean<K, S> {
    fn clone(&self) -> Self {
        Self(self.0.clone(), PhantomData)
    }
}

impl<K: fmt::Debug, S> fmt::Debug for Lean<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<'de, K: de::Deserialize<'de>, S: SkipFields> de::Deserialize<'de> for Lean<K, S> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        K::deserialize(Skipping {
            inner: deserializer,
            skip: S::SKIP,
        })
        .map(|object| Self(object, PhantomData))
    }
}

impl<K, S> Resource for Lean<K, S>
where
    K: Resource,
    S: SkipFields,
{
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }
    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::api_version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn url_path(dt: &Self::DynamicType, namespace: Option<&str>) -> String {
        K::url_path(dt, namespace)
    }
    fn meta(&self) -> &ObjectMeta {
        self.0.meta()
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0.meta_mut()
    }
}

/// A deserializer that leaves out `skip` from the map or struct it decodes.
struct Skipping<'s, D> {
    inner: D,
    skip: &'s [Skip],
}

impl<'s, D> Skipping<'s, D> {
    /// The wrapped deserializer, and `visitor` wrapped to filter the map it is handed.
    fn split<V>(self, visitor: V) -> (D, SkippingVisitor<'s, V>) {
        let visitor = SkippingVisitor {
            inner: visitor,
            skip: self.skip,
        };
        (self.inner, visitor)
    }
}

/// Passes a call on to the wrapped deserializer unchanged: values of these shapes hold no
/// map to filter.
macro_rules! forward_deserialize {
    ($($method:ident($($arg:ident: $ty:ty),*);)*) => {$(
        fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, Self::Error> {
            self.inner.$method($($arg,)* visitor)
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Skipping<'_, D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        let (inner, visitor) = self.split(visitor);
        inner.deserialize_any(visitor)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        let (inner, visitor) = self.split(visitor);
        inner.deserialize_struct(name, fields, visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        let (inner, visitor) = self.split(visitor);
        inner.deserialize_map(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        let (inner, visitor) = self.split(visitor);
        inner.deserialize_option(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        let (inner, visitor) = self.split(visitor);
        inner.deserialize_newtype_struct(name, visitor)
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }

    forward_deserialize! {
        deserialize_bool();
        deserialize_i8();
        deserialize_i16();
        deserialize_i32();
        deserialize_i64();
        deserialize_i128();
        deserialize_u8();
        deserialize_u16();
        deserialize_u32();
        deserialize_u64();
        deserialize_u128();
        deserialize_f32();
        deserialize_f64();
        deserialize_char();
        deserialize_str();
        deserialize_string();
        deserialize_bytes();
        deserialize_byte_buf();
        deserialize_unit();
        deserialize_unit_struct(name: &'static str);
        deserialize_seq();
        deserialize_tuple(len: usize);
        deserialize_tuple_struct(name: &'static str, len: usize);
        deserialize_enum(name: &'static str, variants: &'static [&'static str]);
        deserialize_identifier();
        deserialize_ignored_any();
    }
}

/// The visitor of a [`Skipping`] deserializer: hands its map on filtered.
struct SkippingVisitor<'s, V> {
    inner: V,
    skip: &'s [Skip],
}

macro_rules! forward_visit {
    ($($method:ident($ty:ty);)*) => {$(
        fn $method<E: de::Error>(self, value: $ty) -> Result<Self::Value, E> {
            self.inner.$method(value)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for SkippingVisitor<'_, V> {
    type Value = V::Value;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        self.inner.expecting(formatter)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.inner.visit_map(SkippingMap {
            inner: map,
            skip: self.skip,
            pending: None,
        })
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        self.inner.visit_some(Skipping {
            inner: deserializer,
            skip: self.skip,
        })
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        self.inner.visit_newtype_struct(Skipping {
            inner: deserializer,
            skip: self.skip,
        })
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.inner.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        self.inner.visit_unit()
    }

    fn visit_borrowed_str<E: de::Error>(self, value: &'de str) -> Result<Self::Value, E> {
        self.inner.visit_borrowed_str(value)
    }

    fn visit_borrowed_bytes<E: de::Error>(self, value: &'de [u8]) -> Result<Self::Value, E> {
        self.inner.visit_borrowed_bytes(value)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        self.inner.visit_seq(seq)
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
        self.inner.visit_enum(data)
    }

    forward_visit! {
        visit_bool(bool);
        visit_i8(i8);
        visit_i16(i16);
        visit_i32(i32);
        visit_i64(i64);
        visit_i128(i128);
        visit_u8(u8);
        visit_u16(u16);
        visit_u32(u32);
        visit_u64(u64);
        visit_u128(u128);
        visit_f32(f32);
        visit_f64(f64);
        visit_char(char);
        visit_str(&str);
        visit_string(String);
        visit_bytes(&[u8]);
        visit_byte_buf(Vec<u8>);
    }
}

/// A map's entries without those `skip` names; the values of entries with fields to leave
/// out inside are decoded through [`Skipping`] again.
struct SkippingMap<'s, A> {
    inner: A,
    skip: &'s [Skip],
    /// What to leave out inside the value whose key was just handed on.
    pending: Option<&'s [Skip]>,
}

/// A map key as the input holds it: borrowed when serde_json can (no escapes).
enum Key<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl Key<'_> {
    fn as_str(&self) -> &str {
        match self {
            Key::Borrowed(key) => key,
            Key::Owned(key) => key,
        }
    }
}

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a field name")
            }
            fn visit_borrowed_str<E: de::Error>(self, key: &'de str) -> Result<Key<'de>, E> {
                Ok(Key::Borrowed(key))
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<Key<'de>, E> {
                Ok(Key::Owned(key.to_string()))
            }
            fn visit_string<E: de::Error>(self, key: String) -> Result<Key<'de>, E> {
                Ok(Key::Owned(key))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for SkippingMap<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        loop {
            let Some(key) = self.inner.next_key::<Key<'de>>()? else {
                return Ok(None);
            };
            let found = self.skip.iter().find(|s| s.key == key.as_str());
            if let Some(Skip { inside: None, .. }) = found {
                self.inner.next_value::<IgnoredAny>()?;
                continue;
            }
            self.pending = found.and_then(|s| s.inside);
            let key = match key {
                Key::Borrowed(key) => {
                    seed.deserialize(de::value::BorrowedStrDeserializer::<A::Error>::new(key))
                }
                Key::Owned(key) => {
                    seed.deserialize(de::value::StringDeserializer::<A::Error>::new(key))
                }
            };
            return key.map(Some);
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        match self.pending.take() {
            Some(skip) => self
                .inner
                .next_value_seed(SkippingSeed { inner: seed, skip }),
            None => self.inner.next_value_seed(seed),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

struct SkippingSeed<'s, S> {
    inner: S,
    skip: &'s [Skip],
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for SkippingSeed<'_, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        self.inner.deserialize(Skipping {
            inner: deserializer,
            skip: self.skip,
        })
    }
}

/// A watch event of a lean object as one of the object itself.
pub fn unwrap_event<K, S>(
    event: kube::runtime::watcher::Event<Lean<K, S>>,
) -> kube::runtime::watcher::Event<K> {
    use kube::runtime::watcher::Event;
    match event {
        Event::Apply(object) => Event::Apply(object.0),
        Event::Delete(object) => Event::Delete(object.0),
        Event::Init => Event::Init,
        Event::InitApply(object) => Event::InitApply(object.0),
        Event::InitDone => Event::InitDone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
    use kube::core::{ObjectList, WatchEvent};
    use serde_json::json;

    fn managed_fields() -> serde_json::Value {
        json!([{
            "manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
            "time": "2026-12-01T10:00:00Z", "fieldsType": "FieldsV1",
            "fieldsV1": { "f:metadata": { "f:labels": { ".": {}, "f:app": {} } } }
        }])
    }

    fn pod() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "db-0", "namespace": "ns", "resourceVersion": "7",
                "labels": { "app.kubernetes.io/instance": "db", "we\"ird": "key" },
                "annotations": { "db.devctl.io/status": "{}" },
                "ownerReferences": [{ "apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "u" }],
                "finalizers": ["x"],
                "managedFields": managed_fields(),
            },
            "spec": { "containers": [{ "name": "postgres", "image": "postgres:16",
                "env": [{ "name": "A", "value": "b" }] }] },
            "status": { "phase": "Running", "podIP": "10.0.0.1",
                "conditions": [{ "type": "Ready", "status": "True" }] }
        })
    }

    #[test]
    fn a_lean_pod_is_the_pod_without_the_skipped_fields() {
        let text = serde_json::to_vec(&pod()).unwrap();
        let lean: Lean<Pod, PodFields> = serde_json::from_slice(&text).unwrap();
        let mut full: Pod = serde_json::from_slice(&text).unwrap();
        assert!(full.spec.is_some() && full.metadata.managed_fields.is_some());
        full.spec = None;
        full.metadata.managed_fields = None;
        full.metadata.owner_references = None;
        full.metadata.finalizers = None;
        assert_eq!(lean.0, full);
        // An escaped key is decoded like any other.
        assert_eq!(lean.0.metadata.labels.unwrap()["we\"ird"], "key");
    }

    #[test]
    fn only_managed_fields_are_left_out_of_other_kinds() {
        let text = serde_json::to_vec(&json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": { "name": "db", "namespace": "ns", "managedFields": managed_fields(),
                "annotations": { "devctl.io/last-applied-hash": "abc" } },
            "spec": { "replicas": 1, "selector": { "matchLabels": { "a": "b" } },
                "template": { "metadata": { "labels": { "a": "b" } },
                    "spec": { "containers": [{ "name": "c", "image": "i" }] } },
                "volumeClaimTemplates": [{ "metadata": { "name": "data", "managedFields": [] },
                    "spec": { "resources": { "requests": { "storage": "1Gi" } } } }] },
            "status": { "replicas": 1, "readyReplicas": 1 }
        }))
        .unwrap();
        let mut lean: Lean<StatefulSet, ManagedFields> = serde_json::from_slice(&text).unwrap();
        let mut full: StatefulSet = serde_json::from_slice(&text).unwrap();
        // An apply response decoded lean has the fingerprint the watch path gives the full
        // object: a later event of the same content is recognised as ours.
        assert_eq!(
            crate::children::slim::content(&mut lean.0),
            crate::children::slim::content(&mut full)
        );
        full.metadata.managed_fields = None;
        assert_eq!(lean.0, full);
    }

    #[test]
    fn watch_events_and_list_pages_decode_lean() {
        let event = serde_json::to_vec(&json!({ "type": "MODIFIED", "object": pod() })).unwrap();
        match serde_json::from_slice::<WatchEvent<Lean<Pod, PodFields>>>(&event).unwrap() {
            WatchEvent::Modified(pod) => {
                assert!(pod.0.spec.is_none() && pod.0.metadata.managed_fields.is_none());
                assert_eq!(pod.0.status.unwrap().pod_ip.as_deref(), Some("10.0.0.1"));
            }
            other => panic!("expected MODIFIED, got {other:?}"),
        }
        let claim = json!({ "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": { "name": "data-db-0", "annotations": { "pv.kubernetes.io/bound-by-controller": "yes" },
                "managedFields": managed_fields(), "labels": { "a": "b" } },
            "spec": { "resources": { "requests": { "storage": "1Gi" } } } });
        let page = serde_json::to_vec(&json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaimList",
            "metadata": { "resourceVersion": "9" }, "items": [claim]
        }))
        .unwrap();
        let list: ObjectList<Lean<PersistentVolumeClaim, ClaimFields>> =
            serde_json::from_slice(&page).unwrap();
        let claim = &list.items[0].0;
        assert!(claim.metadata.annotations.is_none() && claim.metadata.managed_fields.is_none());
        assert_eq!(claim.metadata.labels.as_ref().unwrap()["a"], "b");
        assert!(claim.spec.is_some());
    }

    #[test]
    fn invalid_json_inside_a_skipped_field_is_still_an_error() {
        let text = br#"{"metadata":{"name":"a","managedFields":[{"x": }]}}"#;
        assert!(serde_json::from_slice::<Lean<Pod, ManagedFields>>(text).is_err());
    }
}
