//! The fake API server's object store: namespaced objects as JSON, one resource-version
//! counter, an event log for watches (bounded: a watch from a version older than the log
//! gets 410 Gone, as from a real API server), label and field selectors.

use std::collections::{BTreeMap, VecDeque};

use serde_json::{Value, json};
use tokio::sync::broadcast;

/// How many events the log keeps for watches resuming from a version.
const LOG_LEN: usize = 4096;

/// A resource the fake serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `pods`.
    Pod,
    /// `secrets`.
    Secret,
    /// `persistentvolumeclaims`.
    Claim,
    /// `networkpolicies` (networking.k8s.io).
    NetworkPolicy,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Self; 4] = [Self::Pod, Self::Secret, Self::Claim, Self::NetworkPolicy];

    /// The plural in URLs.
    pub fn plural(self) -> &'static str {
        match self {
            Self::Pod => "pods",
            Self::Secret => "secrets",
            Self::Claim => "persistentvolumeclaims",
            Self::NetworkPolicy => "networkpolicies",
        }
    }

    /// The kind named by a URL's plural and group.
    pub fn from_plural(group: &str, plural: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.plural() == plural && k.group() == group)
    }

    /// The kind's name.
    pub fn kind(self) -> &'static str {
        match self {
            Self::Pod => "Pod",
            Self::Secret => "Secret",
            Self::Claim => "PersistentVolumeClaim",
            Self::NetworkPolicy => "NetworkPolicy",
        }
    }

    /// The API group (`""` for the core group).
    pub fn group(self) -> &'static str {
        match self {
            Self::NetworkPolicy => "networking.k8s.io",
            _ => "",
        }
    }

    /// `apiVersion`.
    pub fn api_version(self) -> &'static str {
        match self {
            Self::NetworkPolicy => "networking.k8s.io/v1",
            _ => "v1",
        }
    }

    /// The short names `kubectl` knows.
    pub fn short_names(self) -> &'static [&'static str] {
        match self {
            Self::Pod => &["po"],
            Self::Secret => &[],
            Self::Claim => &["pvc"],
            Self::NetworkPolicy => &["netpol"],
        }
    }
}

/// One change, as a watch sends it.
#[derive(Debug, Clone)]
pub struct Event {
    /// The resource version of the change.
    pub version: u64,
    /// The object's kind.
    pub kind: Kind,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub kind_of_change: &'static str,
    /// The object after the change (before it, for `DELETED`).
    pub object: Value,
}

/// The objects, by kind, namespace and name.
#[derive(Debug)]
pub struct Store {
    objects: BTreeMap<(Kind, String, String), Value>,
    version: u64,
    log: VecDeque<Event>,
    events: broadcast::Sender<Event>,
    next_uid: u64,
    /// Random per store, so uids (and the kubelet's cgroups named after pod uids) never
    /// repeat between fake clusters running side by side.
    uid_prefix: u32,
}

/// Why a store operation failed, as a Kubernetes `Status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusError {
    /// The HTTP status.
    pub code: u16,
    /// `AlreadyExists`, `NotFound`, `Invalid`, …
    pub reason: &'static str,
    /// What happened.
    pub message: String,
}

impl StatusError {
    /// The `Status` object.
    pub fn to_json(&self) -> Value {
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        })
    }
}

fn now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    // RFC 3339 in UTC from the epoch seconds (days to a civil date).
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{d:02}T{h:02}:{m:02}:{s:02}Z")
}

/// The current time as the API writes it.
pub fn timestamp() -> String {
    now()
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

impl Store {
    /// An empty store.
    pub fn new() -> Self {
        let (events, _) = broadcast::channel(4096);
        let mut random = [0u8; 4];
        let _ = getrandom::fill(&mut random);
        Self {
            objects: BTreeMap::new(),
            version: 1,
            log: VecDeque::new(),
            events,
            next_uid: 1,
            uid_prefix: u32::from_le_bytes(random),
        }
    }

    /// The current resource version.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// A receiver of every change from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// The changes after `version`; `None` when the log no longer reaches back that far.
    pub fn events_since(&self, version: u64) -> Option<Vec<Event>> {
        if let Some(first) = self.log.front()
            && version + 1 < first.version
        {
            return None;
        }
        Some(self.log.iter().filter(|e| e.version > version).cloned().collect())
    }

    fn record(&mut self, kind: Kind, change: &'static str, object: Value) {
        let event = Event { version: self.version, kind, kind_of_change: change, object };
        self.log.push_back(event.clone());
        while self.log.len() > LOG_LEN {
            self.log.pop_front();
        }
        let _ = self.events.send(event);
    }

    fn bump(&mut self, object: &mut Value) {
        self.version += 1;
        object["metadata"]["resourceVersion"] = Value::String(self.version.to_string());
    }

    /// One object.
    pub fn get(&self, kind: Kind, namespace: &str, name: &str) -> Option<&Value> {
        self.objects.get(&(kind, namespace.to_owned(), name.to_owned()))
    }

    /// The objects of a kind in a namespace that match the selectors.
    pub fn list(&self, kind: Kind, namespace: &str, selector: &Selector) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((k, ns, _), _)| *k == kind && ns == namespace)
            .map(|(_, v)| v)
            .filter(|v| selector.matches(v))
            .cloned()
            .collect()
    }

    /// Every object of a kind, in every namespace.
    pub fn all(&self, kind: Kind) -> Vec<Value> {
        self.objects.iter().filter(|((k, _, _), _)| *k == kind).map(|(_, v)| v.clone()).collect()
    }

    /// Creates an object: server fields filled in, `ADDED` sent.
    ///
    /// # Errors
    /// 409 `AlreadyExists`, 422 `Invalid` without a name.
    pub fn create(&mut self, kind: Kind, namespace: &str, mut object: Value) -> Result<Value, StatusError> {
        let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        if name.is_empty() {
            return Err(StatusError {
                code: 422,
                reason: "Invalid",
                message: format!("{} is invalid: metadata.name: Required value", kind.kind()),
            });
        }
        let key = (kind, namespace.to_owned(), name.clone());
        if self.objects.contains_key(&key) {
            return Err(StatusError {
                code: 409,
                reason: "AlreadyExists",
                message: format!("{} \"{name}\" already exists", kind.plural()),
            });
        }
        object["apiVersion"] = Value::String(kind.api_version().to_owned());
        object["kind"] = Value::String(kind.kind().to_owned());
        object["metadata"]["namespace"] = Value::String(namespace.to_owned());
        object["metadata"]["uid"] =
            Value::String(format!("{:08x}-0000-4000-8000-{:012x}", self.uid_prefix, self.next_uid));
        self.next_uid += 1;
        object["metadata"]["creationTimestamp"] = Value::String(now());
        if kind == Kind::Pod {
            object["status"] = json!({ "phase": "Pending" });
        }
        self.bump(&mut object);
        self.objects.insert(key, object.clone());
        self.record(kind, "ADDED", object.clone());
        Ok(object)
    }

    /// Applies a JSON merge patch (RFC 7386), `MODIFIED` sent.
    ///
    /// # Errors
    /// 404 `NotFound`.
    pub fn patch(
        &mut self,
        kind: Kind,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> Result<Value, StatusError> {
        self.update(kind, namespace, name, |object| merge(object, patch))
    }

    /// Changes an object with `edit`, `MODIFIED` sent.
    ///
    /// # Errors
    /// 404 `NotFound`.
    pub fn update(
        &mut self,
        kind: Kind,
        namespace: &str,
        name: &str,
        edit: impl FnOnce(&mut Value),
    ) -> Result<Value, StatusError> {
        let key = (kind, namespace.to_owned(), name.to_owned());
        let mut object = self.objects.get(&key).cloned().ok_or_else(|| not_found(kind, name))?;
        let (uid, created) =
            (object["metadata"]["uid"].clone(), object["metadata"]["creationTimestamp"].clone());
        edit(&mut object);
        object["metadata"]["uid"] = uid;
        object["metadata"]["creationTimestamp"] = created;
        object["metadata"]["name"] = Value::String(name.to_owned());
        self.bump(&mut object);
        self.objects.insert(key, object.clone());
        self.record(kind, "MODIFIED", object.clone());
        Ok(object)
    }

    /// Removes an object, `DELETED` sent; returns it.
    ///
    /// # Errors
    /// 404 `NotFound`.
    pub fn remove(&mut self, kind: Kind, namespace: &str, name: &str) -> Result<Value, StatusError> {
        let key = (kind, namespace.to_owned(), name.to_owned());
        let mut object = self.objects.remove(&key).ok_or_else(|| not_found(kind, name))?;
        self.bump(&mut object);
        self.record(kind, "DELETED", object.clone());
        Ok(object)
    }

    /// The objects owned by the object with `uid` (their `ownerReferences`).
    pub fn owned_by(&self, uid: &str) -> Vec<(Kind, String, String)> {
        self.objects
            .iter()
            .filter(|(_, v)| {
                v["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|r| r["uid"].as_str() == Some(uid)))
            })
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// 404 for an object.
pub fn not_found(kind: Kind, name: &str) -> StatusError {
    StatusError { code: 404, reason: "NotFound", message: format!("{} \"{name}\" not found", kind.plural()) }
}

/// RFC 7386: objects merge key by key, `null` removes, anything else replaces.
pub fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(fields) => {
            if !target.is_object() {
                *target = Value::Object(serde_json::Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in fields {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// One term of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Term {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    Absent(String),
}

/// A label selector and a field selector (`metadata.name`, `metadata.namespace`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    labels: Vec<Term>,
    fields: Vec<Term>,
}

fn terms(text: &str) -> Result<Vec<Term>, String> {
    let mut out = Vec::new();
    for raw in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let term = if let Some((k, v)) = raw.split_once("!=") {
            Term::NotEquals(k.trim().to_owned(), v.trim().to_owned())
        } else if let Some((k, v)) = raw.split_once("==") {
            Term::Equals(k.trim().to_owned(), v.trim().to_owned())
        } else if let Some((k, v)) = raw.split_once('=') {
            Term::Equals(k.trim().to_owned(), v.trim().to_owned())
        } else if let Some(k) = raw.strip_prefix('!') {
            Term::Absent(k.trim().to_owned())
        } else if raw.contains(' ') || raw.contains('(') {
            return Err(format!("unsupported selector term {raw:?}"));
        } else {
            Term::Exists(raw.to_owned())
        };
        out.push(term);
    }
    Ok(out)
}

impl Selector {
    /// Parses `labelSelector` and `fieldSelector` query values.
    ///
    /// # Errors
    /// A message for a term the fake does not understand.
    pub fn parse(labels: Option<&str>, fields: Option<&str>) -> Result<Self, String> {
        let fields = terms(fields.unwrap_or_default())?;
        for f in &fields {
            let (Term::Equals(k, _) | Term::NotEquals(k, _) | Term::Exists(k) | Term::Absent(k)) = f;
            if k != "metadata.name" && k != "metadata.namespace" {
                return Err(format!("field label not supported: {k}"));
            }
        }
        Ok(Self { labels: terms(labels.unwrap_or_default())?, fields })
    }

    /// Whether `object` matches.
    pub fn matches(&self, object: &Value) -> bool {
        let label = |k: &str| object["metadata"]["labels"][k].as_str().map(str::to_owned);
        let field = |k: &str| match k {
            "metadata.name" => object["metadata"]["name"].as_str().map(str::to_owned),
            "metadata.namespace" => object["metadata"]["namespace"].as_str().map(str::to_owned),
            _ => None,
        };
        let check = |terms: &[Term], get: &dyn Fn(&str) -> Option<String>| {
            terms.iter().all(|t| match t {
                Term::Equals(k, v) => get(k).as_deref() == Some(v.as_str()),
                Term::NotEquals(k, v) => get(k).as_deref() != Some(v.as_str()),
                Term::Exists(k) => get(k).is_some(),
                Term::Absent(k) => get(k).is_none(),
            })
        };
        check(&self.labels, &label) && check(&self.fields, &field)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_match_labels_and_names() {
        let pod = json!({"metadata": {"name": "a", "namespace": "ns", "labels": {"x": "1", "y": "2"}}});
        let s = |l: &str, f: &str| Selector::parse(Some(l), Some(f)).unwrap().matches(&pod);
        assert!(s("x=1", ""));
        assert!(s("x==1,y", ""));
        assert!(!s("x=2", ""));
        assert!(s("x!=2,!z", ""));
        assert!(!s("z", ""));
        assert!(s("", "metadata.name=a"));
        assert!(!s("", "metadata.name=b"));
        assert!(Selector::parse(None, Some("spec.nodeName=x")).is_err());
        assert!(Selector::parse(Some("x in (a,b)"), None).is_err());
    }

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut v = json!({"a": {"b": 1, "c": 2}, "d": [1]});
        merge(&mut v, &json!({"a": {"b": null, "e": 3}, "d": [2]}));
        assert_eq!(v, json!({"a": {"c": 2, "e": 3}, "d": [2]}));
    }

    #[test]
    fn creates_conflict_and_the_log_expires() {
        let mut store = Store::new();
        let obj = json!({"metadata": {"name": "a"}});
        let created = store.create(Kind::Secret, "ns", obj.clone()).unwrap();
        assert_eq!(created["kind"], "Secret");
        assert_eq!(store.create(Kind::Secret, "ns", obj).unwrap_err().code, 409);
        assert_eq!(store.remove(Kind::Secret, "ns", "b").unwrap_err().code, 404);
        for i in 0..LOG_LEN + 10 {
            store.create(Kind::Secret, "ns", json!({"metadata": {"name": format!("n{i}")}})).unwrap();
        }
        assert!(store.events_since(1).is_none(), "a version older than the log is gone");
        assert!(store.events_since(store.version() - 5).is_some_and(|e| e.len() == 5));
        assert_eq!(timestamp().len(), 20);
    }
}
