//! `bmoe synth`: write a synthetic MoE GGUF.
use anyhow::{anyhow, Context};
use bmoe_synth::{write_model, Preset, SynthArch, SynthSpec, WeightType};

use crate::cli::engine_args::SynthArgs;
use crate::sink::output::{check_output, OutputKind};

fn weight_type(s: &Option<String>, default: WeightType) -> anyhow::Result<WeightType> {
    match s {
        None => Ok(default),
        Some(s) => WeightType::parse(s).ok_or_else(|| {
            anyhow!(
                "unknown weight type {s:?}; expected one of {:?}",
                WeightType::NAMES
            )
        }),
    }
}

/// Builds the spec from the preset and the explicit dimensions, writes it, reports.
pub fn synth(a: SynthArgs) -> anyhow::Result<()> {
    let arch =
        SynthArch::parse(&a.arch).ok_or_else(|| anyhow!("unknown architecture {:?}", a.arch))?;
    let preset =
        Preset::parse(&a.preset).ok_or_else(|| anyhow!("unknown preset {:?}", a.preset))?;
    let p = SynthSpec::preset(preset, arch);
    let spec = SynthSpec {
        arch,
        n_layer: a.layers.unwrap_or(p.n_layer),
        n_embd: a.embd.unwrap_or(p.n_embd),
        n_head: a.heads.unwrap_or(p.n_head),
        n_head_kv: a.heads_kv.unwrap_or(p.n_head_kv),
        n_expert: a.experts.unwrap_or(p.n_expert),
        n_expert_used: a.experts_used.unwrap_or(p.n_expert_used),
        n_ff_exp: a.ff.unwrap_or(p.n_ff_exp),
        n_ctx: a.ctx.unwrap_or(p.n_ctx),
        expert_type: weight_type(&a.expert_type, p.expert_type)?,
        dense_type: weight_type(&a.dense_type, p.dense_type)?,
        router_skew: a.router_skew.unwrap_or(p.router_skew),
        seed: a.seed.unwrap_or(p.seed),
        split: a.split.unwrap_or(p.split),
        tied_output: a.tied_output,
    };
    for f in bmoe_synth::shard_paths(&a.output, spec.split.max(1)) {
        check_output(&f, &[], OutputKind::Gguf, "-o", a.force)?;
    }
    let t0 = std::time::Instant::now();
    let r =
        write_model(&spec, &a.output).with_context(|| format!("writing {}", a.output.display()))?;
    println!(
        "wrote {} ({} layers, width {}, {} experts top-{}, expert FFN {}, experts {:?}, dense {:?}, skew {}): {:.1} MiB in {} file(s), {} tensors, {:.2} MiB routed per token, {:.1} s",
        r.files[0].display(),
        spec.n_layer,
        spec.n_embd,
        spec.n_expert,
        spec.n_expert_used,
        spec.n_ff_exp,
        spec.expert_type,
        spec.dense_type,
        spec.router_skew,
        r.bytes as f64 / 1048576.0,
        r.files.len(),
        r.n_tensors,
        r.routed_bytes_per_token as f64 / 1048576.0,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
