//! `bmoe archs`: the architectures `bmoe synth` writes.
use bmoe_synth::SynthArch;

use crate::cli::engine_args::ArchsArgs;

/// Lists the architectures `synth` writes (and `engine/tests/archs.rs` checks), with what sets
/// each apart. Coverage per gate: docs/architectures.md.
pub fn archs(a: ArchsArgs) -> anyhow::Result<()> {
    let archs: Vec<SynthArch> = SynthArch::NAMES
        .iter()
        .filter_map(|n| SynthArch::parse(n))
        .collect();
    if a.out.json() {
        let v: Vec<serde_json::Value> = archs
            .iter()
            .map(|x| serde_json::json!({"arch": x.name(), "about": x.about()}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let w = archs.iter().map(|x| x.name().len()).max().unwrap_or(0);
    for x in &archs {
        println!("{:w$}  {}", x.name(), x.about());
    }
    println!("\n`bmoe synth --arch NAME` writes one; docs/architectures.md has the gate coverage.");
    Ok(())
}
