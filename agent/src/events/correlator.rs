//! client-go's `EventCorrelator` (`tools/record/events_cache.go`, `NewEventCorrelator` defaults):
//! what keeps a crash loop from flooding the API server with events. Every event passes three
//! stages, in upstream's order:
//!
//! 1. **Aggregation**: events that differ only in their message (same source, object, type,
//!    reason, reporting controller and instance) are counted per 600 s window; from the 10th
//!    distinct message on, a `"(combined from similar events): "` event is sent instead.
//! 2. **Dedup**: an event seen before (same source, object with field path, type, reason and
//!    message) reuses the first one's name and `firstTimestamp`, bumps `count`, and is written as a
//!    strategic-merge patch of `count`, `lastTimestamp` and `message`.
//! 3. **Spam filter**: a token bucket per source + object + type (burst 25, one token per 300 s);
//!    an event over the limit is dropped. The dedup count has already moved on, as upstream's, so
//!    the next event that gets through carries the true count.
//!
//! Pure: the caller passes the time, so tests step a clock of their own.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Event as KubeEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde_json::{Map, Value};

/// Entries each of the three caches keeps (`maxLruCacheEntries`).
const CACHE_ENTRIES: usize = 4096;
/// Distinct messages within [`AGGREGATE_INTERVAL`] from which events are combined
/// (`defaultAggregateMaxEvents`).
const AGGREGATE_MAX_EVENTS: usize = 10;
/// `defaultAggregateIntervalInSeconds`.
const AGGREGATE_INTERVAL: Duration = Duration::from_mins(10);
/// Events a source may send about one object at once (`defaultSpamBurst`).
const SPAM_BURST: f64 = 25.0;
/// Refill of the spam filter's bucket: one event every 5 minutes (`defaultSpamQPS`). A `float32`
/// upstream, whose rounding makes a token whole after exactly 300 s.
const SPAM_QPS: f32 = 1.0 / 300.0;
/// The message prefix of a combined event (`EventAggregatorByReasonMessageFunc`).
pub(super) const AGGREGATE_MESSAGE_PREFIX: &str = "(combined from similar events): ";
/// Joins the parts of a cache key. Upstream concatenates them with no separator at all; a byte no
/// Kubernetes name or kind can hold keeps `a`+`bc` and `ab`+`c` apart, and changes nothing else.
const KEY_SEPARATOR: &str = "\0";

/// What to write for one event.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Correlated {
    /// The event to create, or the full state of the one to patch.
    pub event: KubeEvent,
    /// The strategic-merge patch for an event seen before (its `count` is then above 1).
    pub patch: Option<Value>,
}

/// The aggregator's, the dedup logger's and the spam filter's state.
pub(super) struct EventCorrelator {
    aggregates: Lru<AggregateRecord>,
    observations: Lru<Observation>,
    buckets: Lru<TokenBucket>,
}

#[derive(Clone, Default)]
struct AggregateRecord {
    /// The distinct messages seen in the window (a sorted set, so which one makes room at the
    /// limit is deterministic; upstream pops an arbitrary one).
    messages: BTreeSet<String>,
    last: Option<Timestamp>,
}

/// What the dedup logger remembers of an event (`eventLog`).
#[derive(Clone)]
struct Observation {
    count: i32,
    first_timestamp: Option<Time>,
    name: String,
    resource_version: String,
}

/// `golang.org/x/time/rate` as client-go's passive token bucket uses it: starts full.
struct TokenBucket {
    tokens: f64,
    last: Timestamp,
}

impl Default for EventCorrelator {
    fn default() -> Self {
        Self::with_capacity(CACHE_ENTRIES)
    }
}

impl EventCorrelator {
    fn with_capacity(capacity: usize) -> Self {
        Self {
            aggregates: Lru::new(capacity),
            observations: Lru::new(capacity),
            buckets: Lru::new(capacity),
        }
    }

    /// `EventCorrelate`: the event to write, or `None` when the spam filter drops it.
    pub(super) fn correlate(&mut self, event: KubeEvent, now: Timestamp) -> Option<Correlated> {
        let (event, key) = self.aggregate(event, now);
        let (event, patch) = self.observe(event, key);
        self.spam_filter_allows(&event, now)
            .then_some(Correlated { event, patch })
    }

    /// `UpdateState`: remembers what the API server answered (its name, resourceVersion, count)
    /// under the event's full key.
    pub(super) fn update_state(&mut self, event: &KubeEvent) {
        self.observations
            .put(event_key(event), Observation::of(event));
    }

    /// `EventAggregate`: the event itself with its full key, or the combined event with the
    /// aggregate key (so later combined ones dedupe onto it).
    fn aggregate(&mut self, event: KubeEvent, now: Timestamp) -> (KubeEvent, String) {
        let full_key = event_key(&event);
        let aggregate_key = aggregate_key(&event);
        let mut record = self
            .aggregates
            .get_mut(&aggregate_key)
            .map(|record| record.clone())
            .unwrap_or_default();
        // A record older than the window starts over (a missing one has no time and does too).
        let expired = record
            .last
            .is_none_or(|last| now.duration_since(last) > signed(AGGREGATE_INTERVAL));
        if expired {
            record = AggregateRecord::default();
        }
        record
            .messages
            .insert(text(event.message.as_ref()).to_owned());
        record.last = Some(now);
        if record.messages.len() < AGGREGATE_MAX_EVENTS {
            self.aggregates.put(aggregate_key, record);
            return (event, full_key);
        }
        // The set never grows past the limit: every further distinct message is combined.
        record.messages.pop_first();
        self.aggregates.put(aggregate_key.clone(), record);

        let time = Time(now);
        let involved_name = text(event.involved_object.name.as_ref());
        let combined = KubeEvent {
            metadata: ObjectMeta {
                name: Some(event_name(involved_name, now)),
                namespace: event.metadata.namespace.clone(),
                ..ObjectMeta::default()
            },
            count: Some(1),
            first_timestamp: Some(time.clone()),
            last_timestamp: Some(time),
            message: Some(format!(
                "{AGGREGATE_MESSAGE_PREFIX}{}",
                text(event.message.as_ref())
            )),
            involved_object: event.involved_object,
            type_: event.type_,
            reason: event.reason,
            source: event.source,
            ..KubeEvent::default()
        };
        (combined, aggregate_key)
    }

    /// `eventObserve`: counts the event under `key` and, when it was seen before, turns it into an
    /// update of the first one with the patch that carries the change.
    fn observe(&mut self, mut event: KubeEvent, key: String) -> (KubeEvent, Option<Value>) {
        let mut patch = None;
        if let Some(last) = self
            .observations
            .get_mut(&key)
            .filter(|last| last.count > 0)
        {
            event.metadata.name = Some(last.name.clone());
            event.metadata.resource_version =
                (!last.resource_version.is_empty()).then(|| last.resource_version.clone());
            event.first_timestamp.clone_from(&last.first_timestamp);
            event.count = Some(last.count.saturating_add(1));
            patch = Some(dedup_patch(&event));
        }
        self.observations.put(key, Observation::of(&event));
        (event, patch)
    }

    /// `EventSourceObjectSpamFilter.Filter`, inverted: whether the object still has a token.
    fn spam_filter_allows(&mut self, event: &KubeEvent, now: Timestamp) -> bool {
        let key = spam_key(event);
        if self.buckets.get_mut(&key).is_none() {
            self.buckets.put(
                key.clone(),
                TokenBucket {
                    tokens: SPAM_BURST,
                    last: now,
                },
            );
        }
        self.buckets
            .get_mut(&key)
            .is_some_and(|bucket| bucket.try_accept(now))
    }
}

impl Observation {
    fn of(event: &KubeEvent) -> Self {
        Self {
            count: event.count.unwrap_or_default(),
            first_timestamp: event.first_timestamp.clone(),
            name: text(event.metadata.name.as_ref()).to_owned(),
            resource_version: text(event.metadata.resource_version.as_ref()).to_owned(),
        }
    }
}

impl TokenBucket {
    /// `AllowN(now, 1)`: the state changes only when a token is taken.
    fn try_accept(&mut self, now: Timestamp) -> bool {
        let elapsed = now.duration_since(self.last.min(now)).as_secs_f64();
        let tokens = (self.tokens + elapsed * f64::from(SPAM_QPS)).min(SPAM_BURST);
        if tokens < 1.0 {
            return false;
        }
        self.tokens = tokens - 1.0;
        self.last = now;
        true
    }
}

/// What upstream's two-way strategic merge between the event with `count` 0, `lastTimestamp` at the
/// epoch and no message, and the event itself, comes to: those three fields.
fn dedup_patch(event: &KubeEvent) -> Value {
    let mut patch = Map::new();
    if let Some(count) = event.count.filter(|count| *count != 0) {
        patch.insert("count".to_owned(), Value::from(count));
    }
    if let Some(last) = &event.last_timestamp {
        patch.insert("lastTimestamp".to_owned(), Value::from(format_time(last.0)));
    }
    if let Some(message) = event.message.as_ref().filter(|m| !m.is_empty()) {
        patch.insert("message".to_owned(), Value::from(message.clone()));
    }
    Value::Object(patch)
}

/// A `metav1.Time` as the API writes it (seconds, UTC).
fn format_time(time: Timestamp) -> String {
    time.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// `util.GenerateEventName`: `<object name>.<hex of unix nanoseconds>`, or a random UUID when that
/// is not a valid object name (too long, or the object's name is not a DNS subdomain).
pub(super) fn event_name(object_name: &str, at: Timestamp) -> String {
    let name = format!("{object_name}.{:x}", at.as_nanosecond());
    if is_dns_subdomain(&name) {
        name
    } else {
        random_uuid()
    }
}

/// RFC 1123 subdomain: at most 253 characters of lowercase alphanumerics, `-` and `.`, starting
/// and ending alphanumeric.
fn is_dns_subdomain(name: &str) -> bool {
    let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    name.len() <= 253
        && name.starts_with(alphanumeric)
        && name.ends_with(alphanumeric)
        && name.split('.').all(|label| {
            !label.is_empty() && label.starts_with(alphanumeric) && label.ends_with(alphanumeric)
        })
        && name
            .chars()
            .all(|c| alphanumeric(c) || c == '-' || c == '.')
}

/// A version-4 UUID from the process's hash seed (randomly keyed per `RandomState`), which is
/// random enough for a name nobody has to guess, without a random-number crate.
fn random_uuid() -> String {
    let (high, low) = (random_u64(), random_u64());
    let high = (high & 0xffff_ffff_ffff_0fff) | 0x4000;
    let low = (low & 0x3fff_ffff_ffff_ffff) | 0x8000_0000_0000_0000;
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        high >> 32,
        (high >> 16) & 0xffff,
        high & 0xffff,
        low >> 48,
        low & 0xffff_ffff_ffff
    )
}

/// 64 random bits: std seeds every `RandomState` with fresh keys.
pub(super) fn random_u64() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(0);
    hasher.finish()
}

fn signed(duration: Duration) -> jiff::SignedDuration {
    jiff::SignedDuration::try_from(duration).unwrap_or(jiff::SignedDuration::MAX)
}

fn text(value: Option<&String>) -> &str {
    value.map_or("", String::as_str)
}

fn source_parts(event: &KubeEvent) -> [&str; 2] {
    let source = event.source.as_ref();
    [
        text(source.and_then(|s| s.component.as_ref())),
        text(source.and_then(|s| s.host.as_ref())),
    ]
}

/// `getEventKey`: everything that makes two events the same occurrence.
fn event_key(event: &KubeEvent) -> String {
    let object = &event.involved_object;
    let [component, host] = source_parts(event);
    [
        component,
        host,
        text(object.kind.as_ref()),
        text(object.namespace.as_ref()),
        text(object.name.as_ref()),
        text(object.field_path.as_ref()),
        text(object.uid.as_ref()),
        text(object.api_version.as_ref()),
        text(event.type_.as_ref()),
        text(event.reason.as_ref()),
        text(event.message.as_ref()),
    ]
    .join(KEY_SEPARATOR)
}

/// `EventAggregatorByReasonFunc`'s aggregate key: everything but the message and field path.
fn aggregate_key(event: &KubeEvent) -> String {
    let object = &event.involved_object;
    let [component, host] = source_parts(event);
    [
        component,
        host,
        text(object.kind.as_ref()),
        text(object.namespace.as_ref()),
        text(object.name.as_ref()),
        text(object.uid.as_ref()),
        text(object.api_version.as_ref()),
        text(event.type_.as_ref()),
        text(event.reason.as_ref()),
        text(event.reporting_component.as_ref()),
        text(event.reporting_instance.as_ref()),
    ]
    .join(KEY_SEPARATOR)
}

/// `getSpamKey`: source, object (not the field path: one budget per pod) and type.
fn spam_key(event: &KubeEvent) -> String {
    let object = &event.involved_object;
    let [component, host] = source_parts(event);
    [
        component,
        host,
        text(object.kind.as_ref()),
        text(object.namespace.as_ref()),
        text(object.name.as_ref()),
        text(object.uid.as_ref()),
        text(object.api_version.as_ref()),
        text(event.type_.as_ref()),
    ]
    .join(KEY_SEPARATOR)
}

/// A map that forgets its least recently used entry beyond `capacity` (groupcache's `lru.Cache`).
struct Lru<V> {
    capacity: usize,
    entries: HashMap<String, (u64, V)>,
    /// Use tick -> key, oldest first.
    order: BTreeMap<u64, String>,
    tick: u64,
}

impl<V> Lru<V> {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            entries: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
        }
    }

    fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        self.tick += 1;
        let (used, value) = self.entries.get_mut(key)?;
        self.order.remove(used);
        self.order.insert(self.tick, key.to_owned());
        *used = self.tick;
        Some(value)
    }

    fn put(&mut self, key: String, value: V) {
        self.tick += 1;
        self.order.insert(self.tick, key.clone());
        if let Some((used, _)) = self.entries.insert(key, (self.tick, value)) {
            self.order.remove(&used);
        }
        while self.entries.len() > self.capacity {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.entries.remove(&oldest);
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{EventSource, ObjectReference};
    use serde_json::json;

    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    /// An event as the recorder makes it, about pod `pod` (container `main`).
    fn event(
        pod: &str,
        event_type: &str,
        reason: &str,
        message: &str,
        now: Timestamp,
    ) -> KubeEvent {
        KubeEvent {
            metadata: ObjectMeta {
                name: Some(event_name(pod, now)),
                namespace: Some("ns".to_owned()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                kind: Some("Pod".to_owned()),
                api_version: Some("v1".to_owned()),
                namespace: Some("ns".to_owned()),
                name: Some(pod.to_owned()),
                uid: Some(format!("uid-{pod}")),
                field_path: Some("spec.containers{main}".to_owned()),
                ..ObjectReference::default()
            },
            type_: Some(event_type.to_owned()),
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            source: Some(EventSource {
                component: Some("kubelet".to_owned()),
                host: Some("n1".to_owned()),
            }),
            reporting_component: Some("kubelet".to_owned()),
            reporting_instance: Some("n1".to_owned()),
            ..KubeEvent::default()
        }
    }

    fn warning(pod: &str, message: &str, now: Timestamp) -> KubeEvent {
        event(pod, "Warning", "BackOff", message, now)
    }

    #[test]
    fn a_repeated_event_is_counted_on_the_first_ones_name_with_a_patch() {
        let mut correlator = EventCorrelator::default();
        let first = correlator
            .correlate(warning("web", "back-off", at(0)), at(0))
            .unwrap();
        assert_eq!(first.patch, None);
        assert_eq!(first.event.count, Some(1));
        let name = first.event.metadata.name.clone().unwrap();
        assert_eq!(name, format!("web.{:x}", at(0).as_nanosecond()));

        // The API server answers with the stored object.
        let mut stored = first.event.clone();
        stored.metadata.resource_version = Some("41".to_owned());
        correlator.update_state(&stored);

        let second = correlator
            .correlate(warning("web", "back-off", at(7)), at(7))
            .unwrap();
        assert_eq!(second.event.metadata.name.as_deref(), Some(name.as_str()));
        assert_eq!(
            second.event.metadata.resource_version.as_deref(),
            Some("41")
        );
        assert_eq!(second.event.count, Some(2));
        assert_eq!(second.event.first_timestamp, Some(Time(at(0))));
        assert_eq!(second.event.last_timestamp, Some(Time(at(7))));
        assert_eq!(
            second.patch,
            Some(json!({
                "count": 2,
                "lastTimestamp": format_time(at(7)),
                "message": "back-off",
            }))
        );

        let third = correlator
            .correlate(warning("web", "back-off", at(9)), at(9))
            .unwrap();
        assert_eq!(third.event.count, Some(3));
        assert_eq!(third.patch.unwrap()["count"], 3);
    }

    #[test]
    fn events_differing_in_reason_message_or_container_are_not_deduplicated() {
        let mut correlator = EventCorrelator::default();
        let mut other_container = warning("web", "m", at(0));
        other_container.involved_object.field_path = Some("spec.containers{side}".to_owned());
        for event in [
            warning("web", "m", at(0)),
            warning("web", "other message", at(0)),
            event("web", "Warning", "Failed", "m", at(0)),
            other_container,
        ] {
            let correlated = correlator.correlate(event, at(0)).unwrap();
            assert_eq!(correlated.patch, None);
            assert_eq!(correlated.event.count, Some(1));
        }
    }

    #[test]
    fn the_tenth_distinct_message_is_combined_and_later_ones_patch_the_combined_event() {
        let mut correlator = EventCorrelator::default();
        for i in 1..=9 {
            let message = format!("message {i:02}");
            let correlated = correlator
                .correlate(warning("web", &message, at(i)), at(i))
                .unwrap();
            assert_eq!(correlated.event.message.as_deref(), Some(message.as_str()));
            assert_eq!(correlated.patch, None);
        }
        let combined = correlator
            .correlate(warning("web", "message 10", at(10)), at(10))
            .unwrap();
        assert_eq!(
            combined.event.message.as_deref(),
            Some("(combined from similar events): message 10")
        );
        assert_eq!(combined.patch, None);
        assert_eq!(combined.event.count, Some(1));
        let name = combined.event.metadata.name.clone().unwrap();
        assert_eq!(name, format!("web.{:x}", at(10).as_nanosecond()));
        assert_eq!(combined.event.reason.as_deref(), Some("BackOff"));
        assert_eq!(
            combined.event.involved_object.uid.as_deref(),
            Some("uid-web")
        );
        // Upstream's combined event carries no reporting controller.
        assert_eq!(combined.event.reporting_component, None);

        let next = correlator
            .correlate(warning("web", "message 11", at(11)), at(11))
            .unwrap();
        assert_eq!(next.event.metadata.name.as_deref(), Some(name.as_str()));
        assert_eq!(next.event.count, Some(2));
        assert_eq!(
            next.patch.unwrap()["message"],
            "(combined from similar events): message 11"
        );
    }

    #[test]
    fn aggregation_starts_over_after_ten_quiet_minutes() {
        let mut correlator = EventCorrelator::default();
        for i in 1..=9 {
            correlator
                .correlate(warning("web", &format!("m{i}"), at(i)), at(i))
                .unwrap();
        }
        let later = at(9 + 601);
        let tenth = correlator
            .correlate(warning("web", "m10", later), later)
            .unwrap();
        assert_eq!(tenth.event.message.as_deref(), Some("m10"));
    }

    #[test]
    fn the_spam_filter_drops_the_26th_event_and_refills_one_per_five_minutes() {
        let mut correlator = EventCorrelator::default();
        for i in 1..=25 {
            let correlated = correlator.correlate(warning("web", "crash", at(0)), at(0));
            assert_eq!(correlated.unwrap().event.count, Some(i));
        }
        for _ in 26..=30 {
            assert_eq!(
                correlator.correlate(warning("web", "crash", at(0)), at(0)),
                None
            );
        }
        assert_eq!(
            correlator.correlate(warning("web", "crash", at(299)), at(299)),
            None
        );
        // The dropped ones were counted: the one let through carries the true count.
        let refilled = correlator
            .correlate(warning("web", "crash", at(300)), at(300))
            .unwrap();
        assert_eq!(refilled.event.count, Some(32));
        assert_eq!(
            correlator.correlate(warning("web", "crash", at(300)), at(300)),
            None
        );
    }

    #[test]
    fn objects_and_event_types_have_budgets_of_their_own() {
        let mut correlator = EventCorrelator::default();
        for i in 0..25 {
            correlator
                .correlate(warning("web", &format!("m{i}"), at(0)), at(0))
                .unwrap();
        }
        assert_eq!(
            correlator.correlate(warning("web", "again", at(0)), at(0)),
            None
        );
        // Another container of the same pod shares the pod's budget.
        let mut container = warning("web", "side", at(0));
        container.involved_object.field_path = Some("spec.containers{side}".to_owned());
        assert_eq!(correlator.correlate(container, at(0)), None);
        for i in 0..25 {
            assert!(
                correlator
                    .correlate(warning("db", &format!("m{i}"), at(0)), at(0))
                    .is_some()
            );
            assert!(
                correlator
                    .correlate(
                        event("web", "Normal", "Pulling", &format!("m{i}"), at(0)),
                        at(0)
                    )
                    .is_some()
            );
        }
    }

    #[test]
    fn event_names_fall_back_to_a_uuid_when_not_a_valid_name() {
        assert_eq!(
            event_name("web", at(0)),
            format!("web.{:x}", at(0).as_nanosecond())
        );
        let long = "a".repeat(250);
        let uuid = event_name(&long, at(0));
        assert_eq!(uuid.len(), 36, "{uuid}");
        assert!(is_dns_subdomain(&uuid), "{uuid}");
        assert_ne!(uuid, event_name(&long, at(0)));
        assert!(!is_dns_subdomain("Web.1"));
        assert!(!is_dns_subdomain("web..1"));
    }

    #[test]
    fn the_caches_forget_the_least_recently_used_entry() {
        let mut lru = Lru::new(2);
        lru.put("a".to_owned(), 1);
        lru.put("b".to_owned(), 2);
        assert_eq!(lru.get_mut("a"), Some(&mut 1));
        lru.put("c".to_owned(), 3);
        assert_eq!(lru.get_mut("b"), None);
        assert_eq!(lru.get_mut("a"), Some(&mut 1));
        assert_eq!(lru.get_mut("c"), Some(&mut 3));

        // A forgotten event is new again.
        let mut correlator = EventCorrelator::with_capacity(1);
        correlator
            .correlate(warning("web", "m", at(0)), at(0))
            .unwrap();
        correlator
            .correlate(warning("db", "m", at(0)), at(0))
            .unwrap();
        let again = correlator
            .correlate(warning("web", "m", at(1)), at(1))
            .unwrap();
        assert_eq!(again.patch, None);
    }
}
