//! The one rule for settings that have no effect where they are set (a cache size without
//! streaming, an arena loader count without a prefill device), shared by the one-shot commands
//! and check/plan/run: each names the setting and why, a sweep whose points resolve to the same
//! configuration is refused, and an overlay written from a point carries the values the point's
//! settings depended on.
use serde_json::Value;

use super::settings::{CacheMb, Settings, KEYS};

/// The keys that act only while experts are streamed (`moe_stream`). `cache_floor_mb` is not
/// among them: it is part of the memory budget every run is placed against.
const STREAM_KEYS: &[&str] = &[
    "cache_mb",
    "cache_reserve_mb",
    "cache_min_mb",
    "io_threads",
    "dense_weights",
    "prefetch",
    "cache_policy",
    "read_all_experts",
    "expert_substitute",
    "drop_cold",
    "routing_trace",
];

/// The keys that act only with an expert cache (`cache_mb` above 0).
const CACHE_KEYS: &[&str] = &[
    "cache_reserve_mb",
    "cache_min_mb",
    "cache_policy",
    "expert_substitute",
];

/// The keys that act only with a prefill device.
const DEVICE_KEYS: &[&str] = &[
    "min_tokens",
    "loaders",
    "device_ubatch",
    "routed",
    "routed_full",
    "explain",
];

/// The keys that act only in bmoe's engine: stock llama.cpp (`runtime = "llama.cpp"`) has no
/// streaming, no prefill device, no prefix reuse, and loads and repacks as llama.cpp does.
const BMOE_KEYS: &[&str] = &[
    "moe_stream",
    "device",
    "repack",
    "prefix_reuse",
    "prefix_cache",
    "prefix_cache_mb",
    "n_expert_used",
];

/// Whether `key` acts only in bmoe's engine (inert with `runtime = "llama.cpp"`).
fn bmoe_only(key: &str) -> bool {
    BMOE_KEYS.contains(&key) || STREAM_KEYS.contains(&key) || DEVICE_KEYS.contains(&key)
}

/// The keys a key's effect depends on: the settings an overlay must carry for the key's value to
/// do what it did where it was measured.
pub fn depends_on(key: &str) -> Vec<&'static str> {
    let mut deps = Vec::new();
    if bmoe_only(key) {
        deps.push("runtime");
    }
    if STREAM_KEYS.contains(&key) {
        deps.push("moe_stream");
    }
    if CACHE_KEYS.contains(&key) {
        deps.push("cache_mb");
    }
    if key == "cache_min_mb" {
        deps.push("cache_reserve_mb");
    }
    if DEVICE_KEYS.contains(&key) {
        deps.push("device");
    }
    if key == "prefix_cache_mb" {
        deps.push("prefix_cache");
    }
    deps
}

/// Why `key` has no effect with settings `s` (`moe_stream is false`), or `None` when it acts.
pub fn why_inert(key: &str, s: &Settings) -> Option<&'static str> {
    if s.stock() && bmoe_only(key) {
        return Some("runtime is \"llama.cpp\": stock llama.cpp runs as llama.cpp does");
    }
    if STREAM_KEYS.contains(&key) && !s.moe_stream {
        return Some("moe_stream is false: nothing is streamed");
    }
    if CACHE_KEYS.contains(&key) && s.cache_mb == CacheMb::Mib(0) {
        return Some("cache_mb is 0: there is no expert cache");
    }
    if key == "cache_min_mb" && s.cache_reserve_mb == 0 {
        return Some("cache_reserve_mb is 0: the cache never shrinks");
    }
    if DEVICE_KEYS.contains(&key) && s.device_name().is_none() {
        return Some("device is \"none\": no prefill device runs");
    }
    if key == "prefix_cache_mb" && s.prefix_cache.is_empty() {
        return Some("prefix_cache is not set");
    }
    None
}

/// The keys of `given` that have no effect with `s`, each with why.
pub fn inert_keys<'a>(
    given: impl IntoIterator<Item = &'a str>,
    s: &Settings,
) -> Vec<(&'a str, &'static str)> {
    given
        .into_iter()
        .filter_map(|k| why_inert(k, s).map(|why| (k, why)))
        .collect()
}

/// What the settings do: every inert key at its default, so two settings that differ only in
/// keys without effect compare equal.
pub fn effective(s: &Settings) -> Value {
    let (Ok(mut v), Ok(d)) = (
        serde_json::to_value(s),
        serde_json::to_value(Settings::default()),
    ) else {
        return Value::Null;
    };
    for k in KEYS.iter().filter(|k| why_inert(k, s).is_some()) {
        v[*k] = d[*k].clone();
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_size_without_streaming_is_inert_and_compares_equal() {
        let a = Settings {
            cache_mb: CacheMb::Mib(1),
            ..Settings::default()
        };
        let b = Settings {
            cache_mb: CacheMb::Mib(2),
            ..a.clone()
        };
        assert!(why_inert("cache_mb", &a).is_some());
        assert_eq!(effective(&a), effective(&b));
        let (sa, sb) = (
            Settings {
                moe_stream: true,
                ..a
            },
            Settings {
                moe_stream: true,
                ..b
            },
        );
        assert_eq!(why_inert("cache_mb", &sa), None);
        assert_ne!(effective(&sa), effective(&sb));
    }

    #[test]
    fn every_key_an_inert_rule_names_is_a_setting_and_depends_on_what_makes_it_act() {
        for k in STREAM_KEYS.iter().chain(CACHE_KEYS).chain(DEVICE_KEYS) {
            assert!(KEYS.contains(k), "{k} is not a layered key");
            assert!(!depends_on(k).is_empty(), "{k}");
        }
        assert_eq!(
            depends_on("expert_substitute"),
            ["runtime", "moe_stream", "cache_mb"]
        );
        assert_eq!(depends_on("threads"), Vec::<&str>::new());
    }

    #[test]
    fn lossy_knobs_need_what_they_need() {
        let streamed = Settings {
            moe_stream: true,
            cache_mb: CacheMb::Mib(0),
            ..Settings::default()
        };
        // Without a cache every expert misses: drop_cold acts, a substitute has nothing cached.
        assert_eq!(why_inert("drop_cold", &streamed), None);
        assert!(why_inert("expert_substitute", &streamed).is_some());
    }
}
