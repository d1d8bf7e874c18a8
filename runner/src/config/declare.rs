//! Every layered setting declared once: its name, type, default (from the engine's `settings`),
//! doc line, layer section (`[engine]` or `[prefill]`), schema attributes, one-shot CLI flag,
//! the engine option it sets and its row in docs/configuration.md. The profile's `[engine]` and
//! `[prefill]` tables, the resolved [`Settings`], [`KEYS`], the one-shot flags, the mapping into
//! the engine's options and the docs table are all generated from the table below, so adding a
//! setting is one entry here plus the engine option it reaches.
//!
//! The CSV columns that record settings ([`row_with_settings`], [`with_recorded_settings`],
//! [`SETTING_COLUMNS`]) live here too, in column order: columns are only ever appended.
use bmoe_engine::settings::{
    self, FloatRange, IntRange, CACHE_FLOOR_MB, CACHE_MIN_MB, CACHE_RESERVE_MB, CONTEXT,
    CPU_UBATCH, DEVICE_UBATCH, MIN_TOKENS, N_EXPERT_USED, PREFIX_CACHE_MB,
};
use bmoe_engine::{CacheBudget, LoadOptions, SessionOptions};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::values::{
    auto_loaders, io_threads_schema, loaders_schema, threads_schema, CacheMb, CachePolicy, Count,
    Cpus, DenseWeights, MemoryLimit, Prefetch, PrefixReuse, Repack, Runtime, AUTO_IO_THREADS,
};

/// The table: one entry per setting, in [`KEYS`] order (the order of [`Settings`]' fields and of
/// the schemas' properties). Each entry is `engine { .. }` or `prefill { .. }` (its profile
/// table) holding:
/// - the doc line (the schemas' description) and `name: Type = default;`
/// - `schema [..];` attributes of the layer and resolved fields (schemars ranges)
/// - `flag [..] field: Type => |v| layer value;` the one-shot flag (clap attributes, help text)
///   and the layer value it gives (`None` when not given)
/// - `engine |s, load, session| ..;` what it sets in the engine's options (`()` where placement
///   decides: threads, cores, the cache size, whether a stream or a prefill device exists)
/// - `docs (type, default, engine option, meaning);` its row in docs/configuration.md
macro_rules! declare_settings {
    // Sort the entries into their profile tables, keeping the table order.
    (@split [$($e:tt)*] [$($p:tt)*] [$($all:tt)*]) => {
        declare_settings!(@emit [$($e)*] [$($p)*] [$($all)*]);
    };
    (@split [$($e:tt)*] [$($p:tt)*] [$($all:tt)*] engine { $($body:tt)* } $($rest:tt)*) => {
        declare_settings!(@split [$($e)* { $($body)* }] [$($p)*] [$($all)* { $($body)* }] $($rest)*);
    };
    (@split [$($e:tt)*] [$($p:tt)*] [$($all:tt)*] prefill { $($body:tt)* } $($rest:tt)*) => {
        declare_settings!(@split [$($e)*] [$($p)* { $($body)* }] [$($all)* { $($body)* }] $($rest)*);
    };
    (@emit [$($e:tt)*] [$($p:tt)*] [$($all:tt)*]) => {
        declare_settings!(@layer EngineValues
            "A profile's `[engine]` table: values for the CPU side (all optional; defaults fill the rest)."
            $($e)*);
        declare_settings!(@layer PrefillValues
            "A profile's `[prefill]` table: the prefill device and prompt-piece widths."
            $($p)*);
        declare_settings!(@resolved $($all)*);
        declare_settings!(@docs [engine $($e)*] [prefill $($p)*]);
    };
    (@layer $name:ident $what:literal $({
        $(#[doc = $doc:literal])* $key:ident : $ty:ty = $default:expr;
        schema [$(#[$sattr:meta])*];
        flag [$(#[$fattr:meta])*] $flag:ident : $fty:ty => |$fv:ident| $layer:expr;
        engine |$es:ident, $el:ident, $ess:ident| $map:expr;
        docs ($dty:expr, $ddef:expr, $dopt:expr, $dmeaning:expr $(,)?);
    })*) => {
        #[doc = $what]
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $(
                $(#[doc = $doc])*
                $(#[$sattr])*
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub $key: Option<$ty>,
            )*
        }
    };
    (@resolved $({
        $(#[doc = $doc:literal])* $key:ident : $ty:ty = $default:expr;
        schema [$(#[$sattr:meta])*];
        flag [$(#[$fattr:meta])*] $flag:ident : $fty:ty => |$fv:ident| $layer:expr;
        engine |$es:ident, $el:ident, $ess:ident| $map:expr;
        docs ($dty:expr, $ddef:expr, $dopt:expr, $dmeaning:expr $(,)?);
    })*) => {
        /// Every layered value, resolved: defaults < profile < job overrides < sweep point <
        /// `BMOE_*` < `--set`.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[serde(deny_unknown_fields)]
        pub struct Settings {
            $(
                $(#[doc = $doc])*
                $(#[$sattr])*
                pub $key: $ty,
            )*
        }

        impl Default for Settings {
            fn default() -> Self {
                Self { $($key: $default,)* }
            }
        }

        /// The layered keys, in documentation order.
        pub const KEYS: &[&str] = &[$(stringify!($key)),*];

        /// The setting flags of the one-shot commands: each is the profile key of the same name
        /// (old spellings stay as aliases) and has no default of its own, so an unset flag takes
        /// its value from the layers below it.
        #[derive(Debug, Clone, clap::Args)]
        pub struct SettingFlags {
            $(
                $(#[$fattr])*
                pub $flag: $fty,
            )*
        }

        impl SettingFlags {
            /// The flags given on the command line, as a layer.
            pub fn layer(&self) -> serde_json::Map<String, Value> {
                let mut m = serde_json::Map::new();
                $(
                    let $fv = self.$flag.clone();
                    if let Some(v) = $layer {
                        m.insert(stringify!($key).to_string(), v);
                    }
                )*
                m
            }
        }

        /// Sets every engine option the settings decide alone: `load.stream` and `load.prefill`
        /// are filled where the caller made them `Some` (placement decides whether they exist,
        /// the threads, the cores and the cache size, and may overwrite after this).
        // `()` is the entry of a setting placement maps.
        #[allow(clippy::no_effect, unused_variables)]
        pub fn to_engine(s: &Settings, load: &mut LoadOptions, session: &mut SessionOptions) {
            $(
                let ($es, $el, $ess) = (s, &mut *load, &mut *session);
                $map;
            )*
        }
    };
    (@docs $([$section:ident $({
        $(#[doc = $doc:literal])* $key:ident : $ty:ty = $default:expr;
        schema [$(#[$sattr:meta])*];
        flag [$(#[$fattr:meta])*] $flag:ident : $fty:ty => |$fv:ident| $layer:expr;
        engine |$es:ident, $el:ident, $ess:ident| $map:expr;
        docs ($dty:expr, $ddef:expr, $dopt:expr, $dmeaning:expr $(,)?);
    })*])*) => {
        /// The rows of docs/configuration.md's table of layered values, `[engine]` keys first.
        #[cfg(test)]
        fn docs_rows() -> Vec<String> {
            let mut rows = Vec::new();
            $($(
                rows.push(format!(
                    "| {} | `{}` | {} | {} | {} | {} |",
                    stringify!($section),
                    stringify!($key),
                    $dty,
                    $ddef,
                    $dopt,
                    $dmeaning
                ));
            )*)*
            rows
        }
    };
    ($($entries:tt)*) => {
        declare_settings!(@split [] [] [] $($entries)*);
    };
}

declare_settings! {
    engine {
        /// Compute threads, or "auto".
        threads: Count = count_default(&settings::THREADS);
        schema [#[schemars(schema_with = "threads_schema")]];
        flag [
            /// Compute threads, or `auto`: the cores this process may use (affinity, cgroup quota); more is capped to them.
            #[arg(short = 't', long, value_parser = |s: &str| count_in(s, &settings::THREADS), help_heading = "Threads and memory", display_order = 3)]
        ] threads: Option<Count> => |v| v.as_ref().map(to_json);
        engine |s, load, session| ();
        docs (count_type(&settings::THREADS), int_default_doc(&settings::THREADS), "`SessionOptions.threads`",
            r#"compute threads. `auto` = the cores this process may use (its CPU affinity and its cgroup's CPU quota: a Kubernetes CPU limit, a Slurm allocation). A number above those cores is capped to them with one line (`bmoe plan` shows both; rows record `threads` used and `threads_setting`): ggml's compute threads spin at barriers, and 8 threads on 2 cores run 50-100x slower"#,
        );
    }
    engine {
        /// Context size in tokens (0 = the model's training context).
        context: u32 = CONTEXT.default_u32();
        schema [#[schemars(range(min = CONTEXT.min, max = CONTEXT.max))]];
        flag [
            /// Context size in tokens (0 = the model's training context).
            #[arg(short = 'c', long, alias = "ctx", value_parser = |s: &str| int_in(s, &CONTEXT), help_heading = "Threads and memory", display_order = 5)]
        ] context: Option<u32> => |v| v.map(|v| json!(v));
        engine |s, load, session| session.n_ctx = s.context;
        docs (int_type(&CONTEXT), int_default_doc(&CONTEXT), "`SessionOptions.n_ctx`",
            r#"context in tokens; 0 = the model's training context. It is the limit every length check uses (a prompt longer than it is refused; generation that reaches it stops with `stopped = context_full`). llama.cpp allocates its KV cache rounded up to a multiple of 256, but clamps its batch to the context asked for, so prompt pieces are never wider than `min(ubatch, context)`"#,
        );
    }
    engine {
        /// Stream routed experts from the GGUF instead of mapping the whole model.
        moe_stream: bool = false;
        schema [];
        flag [
            /// Stream routed experts from the GGUF instead of relying on the page cache.
            #[arg(long, help_heading = "Expert streaming", display_order = 8)]
        ] moe_stream: bool => |v| v.then_some(json!(true));
        engine |s, load, session| ();
        docs ("bool", "false", "`LoadOptions.stream` is `Some` only when true",
            r#"stream routed experts from the GGUF instead of mapping the whole model"#,
        );
    }
    engine {
        /// Expert cache in MiB, or "auto".
        cache_mb: CacheMb = match settings::CACHE_MB.default_n() {
            None => CacheMb::Auto,
            Some(n) => CacheMb::Mib(n),
        };
        schema [];
        flag [
            /// Expert cache budget in MiB when streaming (0 = no cache), or `auto`: what the memory
            /// budget leaves (the profile's RAM, or this machine's available memory, minus the floor).
            #[arg(long, value_parser = |s: &str| s.parse::<CacheMb>(), help_heading = "Expert streaming", display_order = 9)]
        ] cache_mb: Option<CacheMb> => |v| v.as_ref().map(to_json);
        // Without a profile `auto` is this machine's available memory minus the floor, sized at
        // load; placement with a profile overwrites it with the size it resolved.
        engine |s, load, session| if let Some(st) = load.stream.as_mut() {
            st.cache = match s.cache_mb {
                CacheMb::Mib(n) => CacheBudget::Mib(n),
                CacheMb::Auto => CacheBudget::Auto { floor_mb: s.cache_floor_mb },
            };
        };
        docs (count_type(&settings::CACHE_MB), int_default_doc(&settings::CACHE_MB), "`StreamOptions.cache_mb`",
            r#"expert cache in MiB; `auto` = what the memory budget leaves (at most every expert); ignored (0) without `moe_stream`"#,
        );
    }
    engine {
        /// MiB of RAM the budget leaves to the OS and other apps.
        cache_floor_mb: u64 = u64::from(CACHE_FLOOR_MB.default_u32());
        schema [#[schemars(range(min = CACHE_FLOOR_MB.min, max = CACHE_FLOOR_MB.max))]];
        flag [
            /// MiB of memory left to everything else when the cache is `auto`.
            #[arg(long, value_parser = |s: &str| CACHE_FLOOR_MB.parse(s).map_err(|e| e.to_string()), help_heading = "Expert streaming", display_order = 10)]
        ] cache_floor_mb: Option<u64> => |v| v.map(|v| json!(v));
        engine |s, load, session| ();
        docs (int_type(&CACHE_FLOOR_MB), int_default_doc(&CACHE_FLOOR_MB), "(placement)",
            r#"RAM left to the OS and other apps: the budget is `ram_mb - cache_floor_mb`. Without a profile (the one-shot commands, `Model::load`) the RAM is what this machine has available; inside a memory cgroup tighter than that less the floor, the group's headroom is planned for with a floor of at most an eighth of it, since other apps live outside the group (the eighth is for the program's code pages and the page cache's working room, which the plan does not count)"#,
        );
    }
    engine {
        /// MiB of memory the expert cache keeps free while it runs: under it (or while tasks stall on memory) the cache shrinks (0 = off).
        cache_reserve_mb: u64 = u64::from(CACHE_RESERVE_MB.default_u32());
        schema [#[schemars(range(min = CACHE_RESERVE_MB.min, max = CACHE_RESERVE_MB.max))]];
        flag [
            /// With --moe-stream: MiB of memory the expert cache keeps free while it runs; under
            /// it, or while tasks stall on memory, the cache shrinks, and grows back once it eases
            /// (0 = the cache keeps its size).
            #[arg(long, value_parser = |s: &str| CACHE_RESERVE_MB.parse(s).map_err(|e| e.to_string()), help_heading = "Expert streaming", display_order = 10)]
        ] cache_reserve_mb: Option<u64> => |v| v.map(|v| json!(v));
        engine |s, load, session| if let Some(st) = load.stream.as_mut() {
            st.cache_reserve_mb = s.cache_reserve_mb;
        };
        docs (int_type(&CACHE_RESERVE_MB), "`0` (off)", "`StreamOptions.cache_reserve_mb`",
            r#"memory the expert cache keeps free for everything else while it runs, so a phone's low-memory killer (or a cgroup's OOM killer) finds nothing to take from bmoe: at routing nodes, at most every 100 ms, bmoe reads the memory available to it (the smaller of `MemAvailable` and the cgroup's limit minus its resident memory) and PSI's memory stall time (`/proc/pressure/memory`); when available memory falls under this, the cache's budget falls below what it holds by the shortfall and a quarter of the reserve (stalls over 10% of the interval alone: an eighth of `cache_mb`), down to `cache_min_mb`, and evictions give the pages back; after a second with at least twice this available and no stalls it grows back, at most to `cache_mb`. The output stays bit for bit the same (the cache only decides what is read). Rows count `cache_shrinks` and `cache_grows` and record `cache_budget_mib`; each resize is one `bmoe:` line. Needs a cache (`cache_mb > 0`); docs/streaming.md "Memory pressure""#,
        );
    }
    engine {
        /// MiB the expert cache never shrinks below under memory pressure.
        cache_min_mb: u64 = u64::from(CACHE_MIN_MB.default_u32());
        schema [#[schemars(range(min = CACHE_MIN_MB.min, max = CACHE_MIN_MB.max))]];
        flag [
            /// With --cache-reserve-mb: MiB the expert cache never shrinks below.
            #[arg(long, value_parser = |s: &str| CACHE_MIN_MB.parse(s).map_err(|e| e.to_string()), help_heading = "Expert streaming", display_order = 10)]
        ] cache_min_mb: Option<u64> => |v| v.map(|v| json!(v));
        engine |s, load, session| if let Some(st) = load.stream.as_mut() {
            st.cache_min_mb = s.cache_min_mb;
        };
        docs (int_type(&CACHE_MIN_MB), int_default_doc(&CACHE_MIN_MB), "`StreamOptions.cache_min_mb`",
            r#"the size memory pressure never shrinks the expert cache below (`cache_reserve_mb`); a layer's routed experts stay resident while it computes whatever this is. Above `cache_mb` it is `cache_mb`"#,
        );
    }
    engine {
        /// Parallel expert-read lanes, or "auto".
        io_threads: Count = count_default(&settings::IO_THREADS);
        schema [#[schemars(schema_with = "io_threads_schema")]];
        flag [
            /// Read lanes when streaming, or `auto` (4).
            #[arg(long, value_parser = |s: &str| count_in(s, &settings::IO_THREADS), help_heading = "Expert streaming", display_order = 11)]
        ] io_threads: Option<Count> => |v| v.as_ref().map(to_json);
        engine |s, load, session| if let Some(st) = load.stream.as_mut() {
            st.io_threads = s.io_threads.or(AUTO_IO_THREADS) as usize;
        };
        docs (count_type(&settings::IO_THREADS), format!("{} ({AUTO_IO_THREADS})", int_default_doc(&settings::IO_THREADS)), "`StreamOptions.io_threads`",
            r#"parallel expert-read lanes. Not capped to the cores: a lane blocks in the kernel on its read, it does not spin"#,
        );
    }
    engine {
        /// Dense weights placement while streaming: mmap or anon.
        dense_weights: DenseWeights = DenseWeights::Mmap;
        schema [];
        flag [
            /// Dense weights when streaming: left in the file mapping (`mmap`) or copied (`anon`).
            #[arg(long, value_enum, help_heading = "Expert streaming", display_order = 12)]
        ] dense_weights: Option<DenseWeights> => |v| v.as_ref().map(to_json);
        engine |s, load, session| if let Some(st) = load.stream.as_mut() {
            st.dense_weights = s.dense_weights.engine();
        };
        docs ("`\"mmap\"` or `\"anon\"`", "`mmap`", "`StreamOptions.dense_weights`",
            r#"where non-expert weights live while streaming"#,
        );
    }
    engine {
        /// Expert reads ahead while streaming: router, eager, repeat or off.
        prefetch: Prefetch = Prefetch::Router;
        schema [];
        flag [
            /// With --moe-stream: read ahead the experts the next layer is predicted to route to
            /// (`router`: the next layer's router on this layer's input; `repeat`: what it routed to on
            /// the previous token) or not (`off`).
            #[arg(long, value_enum, help_heading = "Expert streaming", display_order = 13)]
        ] prefetch: Option<Prefetch> => |v| v.as_ref().map(to_json);
        engine |s, load, session| if let Some(st) = load.stream.as_mut() {
            st.prefetch = s.prefetch.engine();
        };
        docs ("`\"router\"`, `\"eager\"`, `\"repeat\"` or `\"off\"`", "`\"router\"`", "`StreamOptions.prefetch`",
            r#"expert reads ahead while streaming: at each routing node of a decode step, the next MoE layer's router applied to this layer's router input predicts its experts (`repeat`: the experts the next layer routed to on the previous token), and those not in the cache are read on two lanes of their own while this layer computes; the next routing node copies what arrived, waits for what is in flight and reads the rest. A wrong prediction costs only bandwidth and a copy (gate G19); prefill pieces wider than 4 tokens are not predicted. `router` and `repeat` read only once 64 candidates were scored and at least half of the recent ones turned out to be misses, and more of them than the share of decode spent waiting for reads (where decode is read-bound, a wrong read ahead costs more than a right one hides) (predictions go on being scored, on one routing node in seven while paused); `eager` reads the router's prediction from the first token on, never paused. Rows record `prefetched` and `overlap_pct`. The one-shot flag is `--prefetch`"#,
        );
    }
    engine {
        /// Which resident expert the expert cache evicts to make room: next_use or recency.
        cache_policy: CachePolicy = CachePolicy::NextUse;
        schema [];
        flag [
            /// With --moe-stream: which cached expert goes to make room (`next_use`: the one
            /// expected to be used furthest ahead; `recency`: the least recently used).
            #[arg(long, value_enum, help_heading = "Expert streaming", display_order = 14)]
        ] cache_policy: Option<CachePolicy> => |v| v.as_ref().map(to_json);
        engine |s, load, session| if let Some(st) = load.stream.as_mut() {
            st.cache_policy = s.cache_policy.engine();
        };
        docs ("`\"next_use\"` or `\"recency\"`", "`\"next_use\"`", "`StreamOptions.cache_policy`",
            r#"which resident expert the expert cache evicts when a miss needs room. `next_use`: the one whose next use is expected furthest ahead, counted in routing nodes: the MoE layers until its layer's next node, plus the tokens until its layer chooses it again, from how often the layer chose it over about its last ten tokens (the offline optimum's rule with the future estimated; docs/streaming.md). `recency`: the least recently used, and below one token's routed experts the least used (the policy before `next_use`, kept to compare against). Output is the same under either; only the reads differ. The one-shot flag is `--cache-policy`"#,
        );
    }
    engine {
        /// Read every expert of each MoE layer while streaming, not only the routed ones.
        read_all_experts: bool = false;
        schema [];
        flag [
            /// With --moe-stream: read every expert of each layer, not only the routed ones (the
            /// reference selective reads must equal: gate G3; a diagnostic, never faster).
            #[arg(long, help_heading = "Expert streaming", display_order = 14)]
        ] read_all_experts: bool => |v| v.then_some(json!(true));
        engine |s, load, session| if let Some(st) = load.stream.as_mut() {
            st.read_all_experts = s.read_all_experts;
        };
        docs ("bool", "false", "`StreamOptions.read_all_experts`",
            r#"read every expert of each MoE layer while streaming instead of only the routed ones: the reference that selective reads equal bit for bit (gate G3), to check a device whose results are in doubt; it reads far more and is never faster. Ignored without `moe_stream`"#,
        );
    }
    engine {
        /// Lossy: at a cache miss, use a cached expert of the same layer whose router probability is within this of the missed one's (0 = off).
        expert_substitute: f64 = settings::EXPERT_SUBSTITUTE.default;
        schema [#[schemars(range(min = 0.0, max = 1.0))]];
        flag [
            /// With --moe-stream, LOSSY: at a cache miss, use the cached expert of the same layer
            /// whose router probability is closest to the missed one's, when within this (0 = off).
            #[arg(long, value_parser = |s: &str| float_in(s, &settings::EXPERT_SUBSTITUTE), help_heading = "Expert streaming", display_order = 14)]
        ] expert_substitute: Option<f64> => |v| v.map(|v| json!(v));
        engine |s, load, session| if let Some(st) = load.stream.as_mut() {
            st.expert_substitute = s.expert_substitute;
        };
        docs (float_type(&settings::EXPERT_SUBSTITUTE), "`0.0` (off)", "`StreamOptions.expert_substitute`",
            r#"LOSSY speed knob, off at 0: at a routing node, a routed expert the cache lacks is replaced by the cached expert of the same layer (not already chosen for that token) whose router probability (`ffn_moe_probs`, as the graph computes it) is closest to the missed one's, when within this distance; nothing is read for it, and its weight is the router's own probability for the expert used. Only at a miss the cache cannot take without evicting: with every routed expert cached, or while the cache still has room for a routing node's misses, the output is bit for bit that of 0 (gate G35a). Needs a cache (`cache_mb > 0`). Rows count `experts_substituted`; the workflow that prices it is in docs/tuning.md"#,
        );
    }
    engine {
        /// Lossy: skip a missed routed expert whose share of the token's selected router weights is below drop_cold / n_expert_used (0 = off).
        drop_cold: f64 = settings::DROP_COLD.default;
        schema [#[schemars(range(min = 0.0, max = 1.0))]];
        flag [
            /// With --moe-stream, LOSSY: skip a routed expert the cache lacks when its share of the
            /// token's selected router weights is below this times 1/top-k (0 = off).
            #[arg(long, value_parser = |s: &str| float_in(s, &settings::DROP_COLD), help_heading = "Expert streaming", display_order = 14)]
        ] drop_cold: Option<f64> => |v| v.map(|v| json!(v));
        engine |s, load, session| if let Some(st) = load.stream.as_mut() {
            st.drop_cold = s.drop_cold;
        };
        docs (float_type(&settings::DROP_COLD), "`0.0` (off)", "`StreamOptions.drop_cold`",
            r#"LOSSY speed knob, off at 0: a routed expert the cache lacks and has no room for without evicting (every one without a cache) is skipped when its router weight's share of the token's selected weights is below `drop_cold / n_expert_used` (the specification's `--drop-cold-experts F`: "skip a routed expert that is a cache MISS and has < F x (1/top-k) of routing weight"); it is not read and its weight is zeroed before the model's own normalisation, which renormalises the rest. A token's best expert is never dropped. Rows count `experts_dropped`; see docs/tuning.md"#,
        );
    }
    engine {
        /// A file to write the routing trace into (every routing node's experts, for `bmoe
        /// cache-sim`): "" = off.
        routing_trace: String = String::new();
        schema [];
        flag [
            /// With --moe-stream: write every routing node's experts and router probabilities to
            /// FILE (JSON lines), for `bmoe cache-sim`.
            #[arg(long, value_name = "FILE", help_heading = "Expert streaming", display_order = 15)]
        ] routing_trace: Option<String> => |v| v.as_ref().map(|d| json!(d));
        engine |s, load, session| if let Some(st) = load.stream.as_mut() {
            st.routing_trace = (!s.routing_trace.is_empty()).then(|| s.routing_trace.clone().into());
        };
        docs ("path, or `\"\"`", "`\"\"` (off)", "`StreamOptions.routing_trace`",
            r#"a file the streamer writes its routing into, one JSON line per routing node (phase `prompt` or `decode`, first token of the piece, layer, the experts made resident for each token and their router probabilities) after a header (experts per layer and per token, each layer's bytes per expert, the cache budget); each load of the model rewrites it. `bmoe cache-sim FILE --cache-mb 64,128` replays it through the streamer's own cache policy and through Belady's offline optimum (docs/streaming.md). Relative to the working folder; the one-shot flag is `--routing-trace`"#,
        );
    }
    prefill {
        /// ggml device that runs wide prefill pieces (HTP0 = Hexagon NPU), or "none".
        device: String = "none".into();
        schema [#[schemars(regex(pattern = r"^[A-Za-z][A-Za-z0-9_]*$"))]];
        flag [
            /// Run wide prefill pieces on this ggml device (e.g. HTP0, CUDA0), or `none`.
            #[arg(long, alias = "prefill-device", help_heading = "Prefill device", display_order = 15)]
        ] device: Option<String> => |v| v.map(|d| json!(d));
        engine |s, load, session| ();
        docs ("device name (`HTP0`, ...) or `\"none\"`", "`none`", "`LoadOptions.prefill` is `Some` only when named and placement keeps it",
            r#"ggml device that runs wide prefill pieces"#,
        );
    }
    prefill {
        /// Narrowest prompt piece sent to the device; narrower tails run on the CPU.
        min_tokens: u32 = MIN_TOKENS.default_u32();
        schema [#[schemars(range(min = MIN_TOKENS.min, max = MIN_TOKENS.max))]];
        flag [
            /// Pieces at least this wide run on the prefill device.
            #[arg(long, alias = "prefill-min-tokens", value_parser = |s: &str| int_in(s, &MIN_TOKENS), help_heading = "Prefill device", display_order = 16)]
        ] min_tokens: Option<u32> => |v| v.map(|v| json!(v));
        engine |s, load, session| if let Some(p) = load.prefill.as_mut() {
            p.min_tokens = s.min_tokens;
        };
        docs (int_type(&MIN_TOKENS), int_default_doc(&MIN_TOKENS), "`PrefillOptions.min_tokens`",
            r#"narrowest piece sent to the device; narrower tails run on the CPU. At least 2: a one-token device piece has the shape of a decode step, and llama.cpp's graph reuse could run a decode on a graph scheduled for the device. Must be <= `device_ubatch` and <= `context` (when not 0) with a device named"#,
        );
    }
    prefill {
        /// Arena loader threads, or "auto".
        loaders: Count = count_default(&settings::LOADERS);
        schema [#[schemars(schema_with = "loaders_schema")]];
        flag [
            /// Threads filling the prefill device's arena (apart from --io-threads), or `auto` (the usable cores, at most 8).
            #[arg(long, alias = "prefill-loaders", value_parser = |s: &str| count_in(s, &settings::LOADERS), help_heading = "Prefill device", display_order = 18)]
        ] loaders: Option<Count> => |v| v.as_ref().map(to_json);
        engine |s, load, session| if let Some(p) = load.prefill.as_mut() {
            p.loaders = s.loaders.or(auto_loaders()) as usize;
        };
        docs (count_type(&settings::LOADERS), int_default_doc(&settings::LOADERS), "`PrefillOptions.loaders`",
            r#"arena loader threads; `auto` = the usable cores, at most 8"#,
        );
    }
    prefill {
        /// Prompt piece width (ubatch) on the device.
        device_ubatch: u32 = DEVICE_UBATCH.default_u32();
        schema [#[schemars(range(min = DEVICE_UBATCH.min, max = DEVICE_UBATCH.max))]];
        flag [
            /// Prompt piece width on the prefill device.
            #[arg(long, alias = "prefill-ubatch", value_parser = |s: &str| int_in(s, &DEVICE_UBATCH), help_heading = "Prefill device", display_order = 17)]
        ] device_ubatch: Option<u32> => |v| v.map(|v| json!(v));
        // Without a device the context need not be sized for the device's wider pieces.
        engine |s, load, session| session.n_ubatch_device = if load.prefill.is_some() {
            s.device_ubatch
        } else {
            s.cpu_ubatch
        };
        docs (int_type(&DEVICE_UBATCH), int_default_doc(&DEVICE_UBATCH), "`SessionOptions.n_ubatch_device`",
            r#"prompt piece width on the device; must be >= `min_tokens` when a device is named"#,
        );
    }
    prefill {
        /// Prompt piece width (ubatch) on the CPU.
        cpu_ubatch: u32 = CPU_UBATCH.default_u32();
        schema [#[schemars(range(min = CPU_UBATCH.min, max = CPU_UBATCH.max))]];
        flag [
            /// Prompt piece width on the CPU.
            #[arg(long, alias = "ubatch", value_parser = |s: &str| int_in(s, &CPU_UBATCH), help_heading = "Threads and memory", display_order = 6)]
        ] cpu_ubatch: Option<u32> => |v| v.map(|v| json!(v));
        engine |s, load, session| session.n_ubatch = s.cpu_ubatch;
        docs (int_type(&CPU_UBATCH), int_default_doc(&CPU_UBATCH), "`SessionOptions.n_ubatch`",
            r#"prompt piece width on the CPU: a perplexity window's and a generate's prompt pieces; a decision's prompt is cut at min(this, 64) (the reuse grid, `prefix_reuse`)"#,
        );
    }
    prefill {
        /// Read only the experts each graph routes to (true) or whole layers (false).
        routed: bool = true;
        schema [];
        flag [
            /// Read whole layers into the arena instead of only the routed experts (`routed = false`).
            #[arg(long, alias = "no-prefill-routed", help_heading = "Prefill device", display_order = 19)]
        ] no_routed: bool => |v| v.then_some(json!(false));
        engine |s, load, session| if let Some(p) = load.prefill.as_mut() {
            p.routed = s.routed;
        };
        docs ("bool", "true", "`PrefillOptions.routed`",
            r#"read only routed experts into the arena (false: whole layers)"#,
        );
    }
    prefill {
        /// A layer routing more than this share of its experts gets the next layer read whole.
        routed_full: f64 = settings::ROUTED_FULL.default;
        schema [#[schemars(range(max = 1.0), extend("exclusiveMinimum" = 0))]];
        flag [
            /// A layer routing to more than this share of its experts gets the next layer read whole.
            #[arg(long, alias = "prefill-routed-full", value_parser = |s: &str| float_in(s, &settings::ROUTED_FULL), help_heading = "Prefill device", display_order = 20)]
        ] routed_full: Option<f64> => |v| v.map(|v| json!(v));
        engine |s, load, session| if let Some(p) = load.prefill.as_mut() {
            p.routed_full = s.routed_full;
        };
        docs (float_type(&settings::ROUTED_FULL), settings::ROUTED_FULL.default, "`PrefillOptions.routed_full`",
            r#"a layer routing more than this share of its experts gets the next layer read whole"#,
        );
    }
    prefill {
        /// Profile device prefill: every node of a device graph timed alone (slows prefill); the
        /// report goes to stderr and to `<csv>.explain.jsonl`.
        explain: bool = false;
        schema [];
        flag [
            /// Profile device prefill: every node of a device graph timed alone, per op and backend,
            /// bytes copied between CPU and device, splits, and why each op left on the CPU is there
            /// (slows prefill; needs a prefill device).
            #[arg(long, alias = "explain-prefill", help_heading = "Prefill device", display_order = 21)]
        ] explain: bool => |v| v.then_some(json!(true));
        engine |s, load, session| if let Some(p) = load.prefill.as_mut() {
            p.explain = s.explain;
        };
        docs ("bool", "false", "`PrefillOptions.explain`",
            r#"profile device prefill (`--explain` on the one-shot commands): every node of a device graph timed alone, per op and backend, copies, splits, and why each op left on the CPU is there; per unit on stderr and one JSON line in `<csv>.explain.jsonl`. Slows prefill"#,
        );
    }
    prefill {
        /// Experts used per token (top-k) override; 0 = the model's own. Lossy when changed.
        n_expert_used: u32 = N_EXPERT_USED.default_u32();
        schema [#[schemars(range(min = N_EXPERT_USED.min, max = N_EXPERT_USED.max))]];
        flag [
            /// Override the model's experts per token (0 = the model's own).
            #[arg(long, value_parser = |s: &str| int_in(s, &N_EXPERT_USED), help_heading = "Threads and memory", display_order = 7)]
        ] n_expert_used: Option<u32> => |v| v.map(|v| json!(v));
        engine |s, load, session| load.n_expert_used = (s.n_expert_used > 0).then_some(s.n_expert_used);
        docs (int_type(&N_EXPERT_USED), int_default_doc(&N_EXPERT_USED), "`LoadOptions.n_expert_used` (`None` for 0)",
            r#"experts per token (top-k) override; 0 = the model's. Lossy when changed; the engine refuses values above the model's expert count"#,
        );
    }
    engine {
        /// Reuse the KV cache's common prefix between decisions: auto (bit-identical to a fresh
        /// prefill), on (whole common prefix, fastest) or off.
        prefix_reuse: PrefixReuse = PrefixReuse::Auto;
        schema [];
        flag [
            /// Prefix reuse between consecutive decisions: auto (bit-identical to a fresh prefill), on
            /// (whole common prefix, fastest) or off.
            #[arg(long, value_enum, help_heading = "Decisions", display_order = 22)]
        ] prefix_reuse: Option<PrefixReuse> => |v| v.as_ref().map(to_json);
        engine |s, load, session| session.prefix_reuse = s.prefix_reuse.engine();
        docs ("`\"auto\"`, `\"on\"` or `\"off\"`", "`\"auto\"`", "`SessionOptions.prefix_reuse`",
            r#"what a decision keeps of the KV cache the previous call left: `auto` = the common token prefix cut back to a prompt-piece boundary: a decision's prompt is cut into CPU pieces at multiples of min(`cpu_ubatch`, 64) from position 0 (the 64-token grid; a generate's prompt, which nothing later reuses, is cut at `cpu_ubatch` as llama.cpp cuts it; a piece of 24 to 63 rows, a prompt's last, runs padded to 64 rows, whose padding cells are dropped at once: docs/benchmarks.md "Exact reuse on a 64-token grid, padded tails"), so a reuse runs the very pieces a fresh prefill runs and the scores are bit for bit those of a fresh prefill whatever ran before (with a prefill device the grid is `device_ubatch`); `on` = the whole common prefix, the rest prefilled in a first piece up to the next grid step and then on the grid, kept back so that first piece takes the flash-attention kernel a fresh prefill gives those rows (64 rows or more, or padded to 64 from 24: ggml's flash attention rounds a narrower piece differently); fewest tokens prefilled, scores measured bit for bit equal to `off` on the tests' trace but not exact by construction; `off` = every decision prefills from an empty cache. On a memory that cannot keep a prefix by dropping the rest (sliding-window layers, whose cache holds the window's cells only and whose oldest cells new tokens overwrite; a recurrent state), a decision saves sequence 0's state where its rendered `prefix` ends and the next decision that starts with those tokens restores it (`reuse = restore`) instead of prefilling them; else it clears (`miss`, with the reason). Rows record `n_reused`, `n_prefilled` and `reuse` (docs/telemetry.md). The one-shot flag is `--prefix-reuse`"#,
        );
    }
    engine {
        /// CPUs the compute threads run on: "auto" (the fast cores where some are slower), a list, or
        /// a CPU list such as "4-7"; readers and loaders get the others.
        cpus: Cpus = Cpus::Auto;
        schema [];
        flag [
            /// CPUs the compute threads run on: `auto` (the fast cores where some are slower) or a CPU list such as `4-7`.
            #[arg(long, value_parser = |s: &str| s.parse::<Cpus>(), help_heading = "Threads and memory", display_order = 4)]
        ] cpus: Option<Cpus> => |v| v.as_ref().map(to_json);
        engine |s, load, session| ();
        docs ("`\"auto\"`, a list of CPU numbers, or a CPU list such as `\"4-7\"`", "`\"auto\"`", "`SessionOptions.cpus` (compute), `StreamOptions.cpus` and `PrefillOptions.cpus` (the rest)",
            r#"the CPUs the compute threads run on, one thread per CPU through ggml's threadpool mask (`strict_cpu`); the reader and loader threads get the other usable CPUs. `auto` = the cores whose `cpufreq/cpuinfo_max_freq` under `/sys/devices/system/cpu` is at least 75% of the fastest core's, when some cores are slower than that (a phone's efficiency cores); where every core is within 75%, or the kernel gives no frequencies (most VMs), nothing is pinned. With cores chosen, `threads = "auto"` is their count. A CPU this process may not use is an error. `--set cpus=4-7` (a comma there starts a sweep: write `0-3+6`); the one-shot flag is `--cpus`; `bmoe plan` prints the cores and why"#,
        );
    }
    engine {
        /// A folder of saved prefix states that processes share (shards, resumed runs, sweep
        /// points): "" = off.
        prefix_cache: String = String::new();
        schema [];
        flag [
            /// A folder of saved prefix states shared between processes (shards, resumed runs).
            #[arg(long, value_name = "DIR", help_heading = "Decisions", display_order = 23)]
        ] prefix_cache: Option<String> => |v| v.as_ref().map(|d| json!(d));
        engine |s, load, session| session.prefix_cache = (!s.prefix_cache.is_empty()).then(|| bmoe_engine::PrefixCache {
            dir: s.prefix_cache.clone().into(),
            max_bytes: s.prefix_cache_mb << 20,
            // The caller's part of the key (the model's content, the settings) is the runner's:
            // `run::exec` and the one-shot commands fill it once the model is hashed.
            key: String::new(),
        });
        docs ("path, or `\"\"`", "`\"\"` (off)", "`SessionOptions.prefix_cache`",
            r#"a folder of saved prefix states: a decision saves sequence 0's state where its rendered prefix ends on the 64-token grid, and a new process (a shard, a resumed run, a sweep point) restores it instead of prefilling, bit for bit a fresh prefill (`reuse = restore`, `reuse_reason = prefix cache`). Entries are keyed by the model's content hash, every layered setting, the build and llama.cpp pin, the CPU kernels and the piece widths; a damaged or foreign entry is ignored with a `bmoe:` line. Relative to the working folder; the one-shot flag is `--prefix-cache`"#,
        );
    }
    engine {
        /// Size limit of the prefix cache folder in MiB; the least recently used entries go.
        prefix_cache_mb: u64 = PREFIX_CACHE_MB.default_n().unwrap_or(4096);
        schema [#[schemars(range(min = PREFIX_CACHE_MB.min, max = PREFIX_CACHE_MB.max))]];
        flag [
            /// Size limit of the prefix cache folder in MiB.
            #[arg(long, value_parser = |s: &str| PREFIX_CACHE_MB.parse(s).map_err(|e| e.to_string()), help_heading = "Decisions", display_order = 24)]
        ] prefix_cache_mb: Option<u64> => |v| v.map(|v| json!(v));
        engine |s, load, session| ();
        docs (int_type(&PREFIX_CACHE_MB), int_default_doc(&PREFIX_CACHE_MB), "`PrefixCache.max_bytes`",
            r#"size limit of the `prefix_cache` folder; past it the least recently used entries are deleted"#,
        );
    }
    engine {
        /// Weights in llama.cpp's repacked CPU layouts where the CPU has a kernel for their type:
        /// "auto" or "off".
        repack: Repack = Repack::Auto;
        schema [];
        flag [
            /// Weights in llama.cpp's repacked CPU layouts (faster kernels): auto or off.
            #[arg(long, value_enum, help_heading = "Threads and memory", display_order = 8)]
        ] repack: Option<Repack> => |v| v.as_ref().map(to_json);
        engine |s, load, session| load.repack = s.repack.engine();
        docs ("`\"auto\"` or `\"off\"`", "`\"auto\"`", "`LoadOptions.repack`",
            r#"`auto` = llama.cpp's repacked CPU layouts (its `CPU_REPACK` buffer type: Q4_0 as `q4_0_8x8` with AVX2, `q4_0_4x8` with i8mm, ...; and, where the CPU variant has AMX, its `AMX` buffer type, which takes the dense matrices of Q4_0, Q8_0 and other types first) for every weight whose type has a repacked kernel on this CPU and no prefill device runs: a resident run repacks at load (where the model fits in the memory left: a repacked weight is an anonymous copy; a larger model keeps the file's layout and the load says `repack off:`), a streamed run repacks each expert slice as it is read, into its cache slot, and the dense matrices the resident load repacks once at load (copied out of the file's mapping with `dense_weights = "mmap"`), bit for bit the resident repacked run (gate G30). With a prefill device every weight keeps the file's layout (the arena moves it as it is). `off` = the kernels over the file's own layout everywhere. Rows record the setting (`repack`) and the weights held repacked (`repacked_tensors`); `bmoe devices` says whether this CPU has repacked kernels"#,
        );
    }
    engine {
        /// Seconds a model load may take (the probe's child, each load in a run) before it is
        /// abandoned and the check or the model's items fail saying so.
        load_timeout_s: u64 = DEFAULT_LOAD_TIMEOUT_S;
        schema [#[schemars(range(min = 1, max = 1_000_000))]];
        // No flag of the one-shot commands (they load in-process, with no limit); `check` and
        // `run` keep `--load-timeout` as its one-shot form.
        flag [#[arg(skip)]] load_timeout_s: Option<u64> => |v| v.map(|v| json!(v));
        engine |s, load, session| ();
        docs ("integer 1-1000000 (seconds)", format!("`{DEFAULT_LOAD_TIMEOUT_S}`"), "none (the runner's)",
            r#"how long a model load may take before it is given up: the probe's child (`check`, `run`) is killed and each load in a run is abandoned on its thread; the check or the model's items then fail with `the load did not finish within N s (load_timeout_s)`. The default fits a 30 GB model read at 20 MB/s (a slow phone's flash, a busy network share) with room to spare, so only a load that is stuck reaches it. The probe of a model takes the largest value of the jobs and points that use it. `--load-timeout SECS` on `check` and `run` is its one-shot form (the highest layer)"#,
        );
    }
    engine {
        /// What runs the point: "bmoe" (the engine) or "llama.cpp" (stock llama.cpp as a person
        /// runs it, the baseline).
        runtime: Runtime = Runtime::Bmoe;
        schema [];
        flag [
            /// What runs: bmoe, or stock llama.cpp as a person runs it (the baseline).
            #[arg(long, value_enum, help_heading = "Threads and memory", display_order = 2)]
        ] runtime: Option<Runtime> => |v| v.as_ref().map(to_json);
        engine |s, load, session| if s.stock() {
            load.stock = true;
            load.n_expert_used = None;
            session.prefix_reuse = bmoe_engine::PrefixReuse::Off;
            session.prefix_cache = None;
        };
        docs ("`\"bmoe\"` or `\"llama.cpp\"`", "`\"bmoe\"`", "`LoadOptions.stock`",
            r#"`llama.cpp` = the point runs stock llama.cpp on the same vendored library, as a person running llama.cpp would: its default load (the file mapped, its CPU repack wherever a kernel exists, whatever memory is left), each prompt decoded in pieces of the batch width (`cpu_ubatch`) as llama.cpp cuts it (no 64-token grid, no padding), nothing kept between calls (every decision prefills its whole prompt), no expert streaming, no prefill device, the model's own experts per token. The threads, cores, context and batch are the point's, and its rows are ordinary rows (speed, memory, reads, choice log-probabilities, `best`), so `report` measures every other point against it (the default reference where a job and profile have one: speed-up and agreement on `best`) and `compare` takes it as any point. Settings stock llama.cpp has no use for (`moe_stream` and the streaming keys, `device` and the prefill keys, `repack`, `prefix_reuse`, `prefix_cache`, `n_expert_used`) are inert there, with a warning where a job sets them. Rows record it (`runtime`)"#,
        );
    }
    engine {
        /// A memory cgroup around the point's process, page cache included, as a phone's RAM
        /// bounds it: "none", "profile" (the profile's ram_mb) or a number of MiB.
        memory_limit: MemoryLimit = MemoryLimit::None;
        schema [];
        // `bmoe run` only (the one-shot commands run in-process): `--memory-limit` there.
        flag [#[arg(skip)]] memory_limit: Option<MemoryLimit> => |v| v.as_ref().map(to_json);
        engine |s, load, session| ();
        docs ("`\"none\"`, `\"profile\"` or integer 64..16777216 (MiB)", "`\"none\"`", "none (the runner's)",
            r#"`bmoe run` runs the point in a child process inside a memory cgroup of this size (v1 `memory.limit_in_bytes` with `memory.memsw.limit_in_bytes` the same and swappiness 0; v2 `memory.max` with `memory.swap.max = 0`), page cache included, as a phone's RAM bounds it; `profile` = the profile's `ram_mb`. Implies `cold_start` (pages already cached were charged to whoever read them first). A point over it is killed by the kernel's OOM killer and its items get error rows saying so; where the cgroup cannot be made (not root, no memory controller, no delegation) the run is refused before anything runs. Rows record `memory_limit_mib`, `memory_enforced` and `memory_peak_mib`; `--memory-limit` on `bmoe run`. See "Memory limit" below"#,
        );
    }
    engine {
        /// Drop the model file's pages from the page cache before the point loads (an honest
        /// first token).
        cold_start: bool = false;
        schema [];
        flag [#[arg(skip)]] cold_start: bool => |v| v.then_some(json!(true));
        engine |s, load, session| ();
        docs ("bool", "false", "none (the runner's)",
            r#"before the point's model loads, its file's pages are dropped from the page cache (`posix_fadvise(DONTNEED)`; a model the runner still holds from the previous point is released first), so the load and the first token read from storage: a phone's cold start. Pages another process maps stay. On with any `memory_limit`; `--cold-start` on `bmoe run`"#,
        );
    }
    engine {
        /// Measure the storage's random-read rate before the point loads, for the floor
        /// `bmoe report` puts a streamed point's decode against.
        disk_probe: bool = false;
        schema [];
        flag [#[arg(skip)]] disk_probe: bool => |v| v.then_some(json!(true));
        engine |s, load, session| ();
        docs ("bool", "false", "none (the runner's)",
            r#"before the point's model loads (after its cold start), `bmoe run` reads the model file for 2 s in random `O_DIRECT` reads of one expert matrix's mean size (the largest layer's routed expert bytes over its experts and three matrices, rounded up to 4 KiB), `io_threads` reads in flight (the reader lanes a decode node's misses use): the rate decode's misses can be read at, measured in the same sitting as the point, since a machine's storage rate moves within an hour. Rows record it (`disk_mib_s`), and `bmoe report` gives each streamed point that has it its decode time against the floor: decode's own reads a token at that rate plus the reference point's decode time a token (its `decode x floor` column; docs/report.md). A probe that cannot run (no `O_DIRECT` on the file system) is said on stderr and leaves the column empty. Nothing else changes: the reads bypass the page cache. `--set disk_probe=true` on `bmoe run`"#,
        );
    }
}

/// The default of `load_timeout_s`: a 30 GB model read at 20 MB/s (a slow phone's flash, a busy
/// network share) with room to spare; only a load that is stuck gets near it.
pub const DEFAULT_LOAD_TIMEOUT_S: u64 = 3600;

/// A count setting's default from its definition in the engine's `settings`.
fn count_default(r: &IntRange) -> Count {
    r.default_n().map_or(Count::Auto, |n| Count::N(n as u32))
}

/// A flag's integer value, checked against the setting's range in the engine's `settings`.
pub fn int_in(s: &str, r: &IntRange) -> Result<u32, String> {
    r.parse(s)
        .map_err(|e| e.to_string())
        .and_then(|v| u32::try_from(v).map_err(|_| format!("{v} does not fit in 32 bits")))
}

/// A flag's count (`auto` or a number in the setting's range).
fn count_in(s: &str, r: &IntRange) -> Result<Count, String> {
    let c: Count = s.parse()?;
    if let Count::N(n) = c {
        r.check(u64::from(n)).map_err(|e| e.to_string())?;
    }
    Ok(c)
}

/// A flag's real value, checked against the setting's range in the engine's `settings`.
pub fn float_in(s: &str, r: &FloatRange) -> Result<f64, String> {
    r.parse(s).map_err(|e| e.to_string())
}

/// A flag's value as the layer holds it (the same JSON a profile's value would be).
fn to_json<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// The docs' type cell of an integer setting: `integer 0..1024`.
#[cfg(test)]
fn int_type(r: &IntRange) -> String {
    format!("integer {}..{}", r.min, r.max)
}

/// The docs' type cell of an integer setting that also takes `"auto"`.
#[cfg(test)]
fn count_type(r: &IntRange) -> String {
    format!("{} or `\"auto\"`", int_type(r))
}

/// The docs' type cell of a real setting: `number in (0, 1]`.
#[cfg(test)]
fn float_type(r: &FloatRange) -> String {
    r.expected().trim_start_matches("a ").to_string()
}

/// The docs' default cell of an integer setting.
#[cfg(test)]
fn int_default_doc(r: &IntRange) -> String {
    match r.default {
        settings::IntDefault::Auto => "`\"auto\"`".into(),
        settings::IntDefault::N(n) => n.to_string(),
    }
}

/// The columns that hold a resolved setting (what the configuration made of a run), in one list
/// for every reader that asks whether two rows ran alike: `report` splits a point whose rows
/// differ in them, `compare` lists those that changed between two runs.
pub const SETTING_COLUMNS: &[&str] = &[
    "threads_setting",
    "threads",
    "context",
    "moe_stream",
    "cache_mb",
    "io_threads",
    "dense_weights",
    "prefill_device_requested",
    "prefill_device_plan",
    "device_ubatch",
    "cpu_ubatch",
    "min_tokens",
    "loaders",
    "routed",
    "routed_full",
    "n_expert_used",
    "prefetch",
    "scoring",
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "n_predict",
    "chat",
    "repack",
    "memory_limit_mib",
];

/// The column that records every layered value a row ran with ([`settings_cell`]): the one
/// recorded form of each declaration, so a setting added to the table above is in every row
/// without a line elsewhere.
pub const SETTINGS_COLUMN: &str = "settings";

/// Every name that records how a row was configured, in one list for every reader that asks
/// whether two rows ran alike (`report` splits a point whose rows differ in one, `compare` lists
/// those that changed): the [`SETTING_COLUMNS`] (values as resolved: the cache granted, the
/// threads used), then `settings.<key>` for each layered key as configured.
pub static RECORDED_SETTINGS: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
    let columns = SETTING_COLUMNS.iter().map(|c| c.to_string());
    let compared = KEYS.iter().filter(|k| !OUTSIDE_THE_RESULT.contains(k));
    let keys = compared.map(|k| format!("{SETTINGS_COLUMN}.{k}"));
    columns.chain(keys).collect()
});

/// Layered keys recorded in the `settings` cell but not compared: they cannot change a row's
/// result, speed or memory (a load's time limit only decides when a stuck load is given up; a
/// routing trace only records what ran; a disk probe reads before the load, past the page cache),
/// so two runs that differ in them ran alike.
pub const OUTSIDE_THE_RESULT: &[&str] = &["load_timeout_s", "routing_trace", "disk_probe"];

/// The `settings` cell: every layered value, as configured (`"auto"` kept), one compact JSON
/// object in declaration order; its schema (ranges, enums) is `Settings`' own.
pub fn settings_cell(s: &Settings) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// The `settings_hash` cell: the first 16 hex digits of the `settings` cell's SHA-256, so a
/// dashboard can group rows that ran alike without parsing JSON.
pub fn settings_hash(cell: &str) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(cell.as_bytes());
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Each key of a `settings` cell with its value spelled plainly (`auto`, `0.1`, `true`); empty
/// for an empty cell (a build before schema 10) or one that does not parse.
pub fn settings_values(cell: &str) -> std::collections::BTreeMap<String, String> {
    let Ok(Value::Object(m)) = serde_json::from_str::<Value>(cell) else {
        return Default::default();
    };
    let plain = |v: Value| match v {
        Value::String(s) => s,
        Value::Null => String::new(),
        v => v.to_string(),
    };
    m.into_iter().map(|(k, v)| (k, plain(v))).collect()
}

/// The CSV row struct with its configuration columns (`threads` to `n_expert_used`, in column
/// order) between the identity columns (`{ .. }`) and the rest (`then { .. }`): the column order
/// is the field order, and columns are only ever appended.
macro_rules! row_with_settings {
    ($(#[$m:meta])* pub struct $name:ident { $($head:tt)* } then { $($tail:tt)* }) => {
        $(#[$m])*
        pub struct $name {
            $($head)*
            /// Compute threads used: the `threads` setting capped to the cores this process may use
            /// (`auto` = those cores).
            pub threads: u32,
            /// Context size the session enforces (as configured; 0 resolved to the model's training
            /// context).
            #[schemars(extend("x-unit" = "tokens"))]
            pub context: u32,
            /// Expert streaming on.
            pub moe_stream: bool,
            /// Expert cache the loaded model's streamer was granted, in MiB (0 when not streaming).
            #[schemars(extend("x-unit" = "MiB"))]
            pub cache_mb: u64,
            /// Expert-read lanes (`auto` resolved).
            pub io_threads: u32,
            /// Dense weights placement.
            pub dense_weights: String,
            /// The device that ran prefill pieces of this item (`prefill_dev_tokens > 0`); empty when the
            /// CPU ran all of it (schema 1 wrote the planned device here; see `prefill_device_plan`).
            pub prefill_device: String,
            /// ubatch on the device.
            #[schemars(extend("x-unit" = "tokens"))]
            pub device_ubatch: u32,
            /// ubatch on the CPU.
            #[schemars(extend("x-unit" = "tokens"))]
            pub cpu_ubatch: u32,
            /// Narrowest piece sent to the device.
            #[schemars(extend("x-unit" = "tokens"))]
            pub min_tokens: u32,
            /// Arena loader threads (`auto` resolved).
            pub loaders: u32,
            /// Routed arena on.
            pub routed: bool,
            /// Whole-layer threshold of the routed arena.
            #[schemars(extend("x-unit" = "fraction"))]
            pub routed_full: f64,
            /// Experts used per token (effective top-k).
            pub n_expert_used: u32,
            $($tail)*
        }
    };
}
pub(crate) use row_with_settings;

/// A row literal (`Row { .., ..base }`) with the columns that record settings as resolved
/// (`threads_setting`, `io_threads`, `prefetch`, `device_ubatch`, ...) filled from `$s`, a
/// `&Settings`; the columns placement decides (threads used, context, cache size, devices) are
/// the caller's.
macro_rules! with_recorded_settings {
    ($s:expr => $row:ident { $($body:tt)* }) => {{
        let s: &$crate::config::declare::Settings = $s;
        let cell = $crate::config::declare::settings_cell(s);
        $row {
            threads_setting: s.threads.to_string(),
            settings_hash: $crate::config::declare::settings_hash(&cell),
            settings: cell,
            moe_stream: s.streams(),
            runtime: s.runtime.to_string(),
            io_threads: s.io_threads.or($crate::config::values::AUTO_IO_THREADS),
            dense_weights: s.dense_weights.to_string(),
            prefetch: s.prefetch.to_string(),
            prefill_device_requested: s.device_name().unwrap_or_default().to_string(),
            device_ubatch: s.device_ubatch,
            cpu_ubatch: s.cpu_ubatch,
            min_tokens: s.min_tokens,
            loaders: s.loaders.or($crate::config::values::auto_loaders()),
            routed: s.routed,
            routed_full: s.routed_full,
            $($body)*
        }
    }};
}
pub(crate) use with_recorded_settings;

#[cfg(test)]
mod tests {
    use super::*;

    const DOCS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/configuration.md");

    /// Whether a line of docs/configuration.md is a row of the layered-values table.
    fn is_row(l: &str) -> bool {
        l.starts_with("| engine |") || l.starts_with("| prefill |")
    }

    /// docs/configuration.md with the table's rows (one run of lines) replaced by `rows`.
    fn with_rows(text: &str, rows: &[String]) -> String {
        let lines: Vec<&str> = text.lines().collect();
        let first = lines.iter().position(|l| is_row(l)).unwrap_or(lines.len());
        let end = first + lines[first..].iter().take_while(|l| is_row(l)).count();
        let mut out: Vec<&str> = lines[..first].to_vec();
        out.extend(rows.iter().map(String::as_str));
        out.extend(&lines[end..]);
        out.join("\n") + "\n"
    }

    /// The table must be what the declarations generate. `BMOE_BLESS=1` rewrites its rows
    /// (after adding or editing a declaration) instead of failing.
    #[test]
    fn the_docs_table_is_generated_from_the_declarations() {
        let text = std::fs::read_to_string(DOCS).expect("docs/configuration.md");
        let want = with_rows(&text, &docs_rows());
        if std::env::var_os("BMOE_BLESS").is_some() {
            std::fs::write(DOCS, &want).expect("writing docs/configuration.md");
            return;
        }
        let have: Vec<&str> = text.lines().filter(|l| is_row(l)).collect();
        let rows = docs_rows();
        for (i, (w, h)) in rows.iter().zip(&have).enumerate() {
            assert_eq!(
                h,
                w,
                "docs/configuration.md's table row {} differs from its declaration in \
                 runner/src/config/declare.rs: edit the declaration, then run \
                 `BMOE_BLESS=1 cargo test -p bmoe-runner --lib declare` to rewrite the table",
                i + 1
            );
        }
        assert_eq!(
            have.len(),
            rows.len(),
            "docs/configuration.md's table vs the declarations: run \
             `BMOE_BLESS=1 cargo test -p bmoe-runner --lib declare` to rewrite the table"
        );
        assert_eq!(
            text, want,
            "docs/configuration.md's table rows are not one run of lines"
        );
    }

    /// Every declared setting is recorded in every row: a setting whose serialization skipped it
    /// (or a `settings` cell built some other way) would leave rows that cannot say how they ran.
    #[test]
    fn every_declared_setting_has_a_recorded_form() {
        let lossy = Settings {
            drop_cold: 0.25,
            expert_substitute: 0.5,
            ..Settings::default()
        };
        let values = settings_values(&settings_cell(&lossy));
        let recorded: Vec<&str> = values.keys().map(String::as_str).collect();
        let mut declared = KEYS.to_vec();
        declared.sort_unstable();
        assert_eq!(recorded, declared, "the settings cell vs the declared keys");
        assert_eq!(values["drop_cold"], "0.25");
        assert_eq!(values["expert_substitute"], "0.5");
        for k in KEYS.iter().filter(|k| !OUTSIDE_THE_RESULT.contains(k)) {
            let name = format!("{SETTINGS_COLUMN}.{k}");
            assert!(RECORDED_SETTINGS.contains(&name), "{name} is not compared");
        }
        // Two settings that differ hash apart.
        let base = settings_cell(&Settings::default());
        assert_ne!(settings_hash(&base), settings_hash(&settings_cell(&lossy)));
    }

    #[test]
    fn engine_option_defaults_are_the_declared_defaults() {
        let s = Settings::default();
        let mut load = LoadOptions {
            stream: Some(bmoe_engine::StreamOptions::default()),
            prefill: Some(bmoe_engine::PrefillOptions::default()),
            ..LoadOptions::default()
        };
        let mut session = SessionOptions::default();
        let (load0, session0) = (load.clone(), session.clone());
        to_engine(&s, &mut load, &mut session);
        assert_eq!(
            load, load0,
            "LoadOptions::default() vs the declared defaults"
        );
        assert_eq!(
            session, session0,
            "SessionOptions::default() vs the declared defaults"
        );
    }

    #[test]
    fn settings_reach_their_engine_options() {
        let s = Settings {
            context: 100,
            cache_mb: CacheMb::Mib(5),
            io_threads: Count::N(3),
            dense_weights: DenseWeights::Anon,
            prefetch: Prefetch::Off,
            min_tokens: 8,
            loaders: Count::N(5),
            device_ubatch: 128,
            cpu_ubatch: 64,
            routed: false,
            routed_full: 0.5,
            explain: true,
            n_expert_used: 2,
            prefix_reuse: PrefixReuse::Off,
            ..Settings::default()
        };
        let mut load = LoadOptions {
            stream: Some(bmoe_engine::StreamOptions::default()),
            prefill: Some(bmoe_engine::PrefillOptions::default()),
            ..LoadOptions::default()
        };
        let mut session = SessionOptions::default();
        to_engine(&s, &mut load, &mut session);
        let (st, p) = (load.stream.unwrap(), load.prefill.unwrap());
        assert_eq!(load.n_expert_used, Some(2));
        assert_eq!(
            (st.cache, st.io_threads, st.dense_weights, st.prefetch),
            (
                CacheBudget::Mib(5),
                3,
                bmoe_engine::DenseWeights::Anon,
                bmoe_engine::Prefetch::Off
            )
        );
        assert_eq!(
            (p.min_tokens, p.loaders, p.routed, p.routed_full, p.explain),
            (8, 5, false, 0.5, true)
        );
        assert_eq!(
            (session.n_ctx, session.n_ubatch, session.n_ubatch_device),
            (100, 64, 128)
        );
        assert_eq!(session.prefix_reuse, bmoe_engine::PrefixReuse::Off);
        // Without a prefill device the device pieces are the CPU's width.
        let mut load = LoadOptions::default();
        to_engine(&s, &mut load, &mut session);
        assert_eq!(session.n_ubatch_device, 64);
        assert!(load.stream.is_none() && load.prefill.is_none());
    }
}
