//! Synthetic models: deterministic bytes, the architectures and types load in llama.cpp, split
//! GGUFs load like single files.
mod common;

use bmoe_engine::{CancelToken, EngineError, GenerateOptions, LoadOptions, Model};
use bmoe_synth::{write_model, Preset, SynthArch, SynthSpec, WeightType};

fn greedy(path: &std::path::Path) -> Vec<i32> {
    let m = Model::load(&LoadOptions::new(path)).expect("load");
    let mut s = m.session(&common::session_opts()).unwrap();
    s.generate(
        "Route me",
        &GenerateOptions {
            n_predict: 12,
            ..Default::default()
        },
        &CancelToken::new(),
    )
    .unwrap()
    .tokens
}

#[test]
fn same_spec_same_bytes() {
    let spec = SynthSpec::preset(Preset::Tiny, SynthArch::Qwen3Moe);
    let a = common::dir().join("det-a.gguf");
    let b = common::dir().join("det-b.gguf");
    write_model(&spec, &a).unwrap();
    write_model(&spec, &b).unwrap();
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let c = common::dir().join("det-c.gguf");
    write_model(&SynthSpec { seed: 7, ..spec }, &c).unwrap();
    assert_ne!(std::fs::read(&a).unwrap(), std::fs::read(&c).unwrap());
}

#[test]
fn olmoe_loads_and_generates() {
    let m = Model::load(&LoadOptions::new(common::tiny_olmoe())).unwrap();
    assert_eq!(m.info().arch, "olmoe");
    assert_eq!((m.info().n_expert, m.info().n_expert_used), (8, 2));
    assert!(!greedy(&common::tiny_olmoe()).is_empty());
}

#[test]
fn a_dense_llama_loads_and_generates() {
    let p = common::model("dense", &SynthSpec::preset(Preset::Tiny, SynthArch::Llama));
    assert!(!greedy(&p).is_empty());
}

#[test]
fn split_gguf_loads_like_the_single_file() {
    let spec = SynthSpec::preset(Preset::Tiny, SynthArch::Qwen3Moe);
    let single = common::tiny();
    let dir = common::dir().join("split");
    let r = write_model(&SynthSpec { split: 2, ..spec }, &dir.join("m.gguf")).unwrap();
    assert_eq!(r.files.len(), 2);
    assert!(r.files[0].ends_with("m-00001-of-00002.gguf"));
    assert_eq!(greedy(&r.files[0]), greedy(&single));
    // A missing shard is a load error naming it.
    std::fs::remove_file(&r.files[1]).unwrap();
    let e = Model::load(&LoadOptions::new(&r.files[0])).err().unwrap();
    assert!(
        matches!(
            e,
            EngineError::MissingShard {
                shard: 2,
                count: 2,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn every_weight_type_loads() {
    for (i, (et, dt, width)) in [
        (WeightType::F32, WeightType::F16, 128),
        (WeightType::F16, WeightType::Q8_0, 128),
        (WeightType::Q4_0, WeightType::Q4_0, 128),
        (WeightType::Q4_K, WeightType::Q4_K, 256),
        (WeightType::MXFP4, WeightType::Q8_0, 128),
    ]
    .into_iter()
    .enumerate()
    {
        let spec = SynthSpec {
            n_embd: width,
            n_ff_exp: width,
            expert_type: et,
            dense_type: dt,
            ..SynthSpec::preset(Preset::Tiny, SynthArch::Qwen3Moe)
        };
        let p = common::model(&format!("types-{i}"), &spec);
        assert!(!greedy(&p).is_empty(), "{et:?}/{dt:?}");
    }
}

#[test]
fn a_width_that_does_not_fit_the_block_is_refused() {
    let spec = SynthSpec {
        expert_type: WeightType::Q4_K,
        ..SynthSpec::preset(Preset::Tiny, SynthArch::Qwen3Moe)
    };
    let e = write_model(&spec, &common::dir().join("bad.gguf"))
        .err()
        .unwrap();
    assert!(matches!(e, bmoe_synth::SynthError::Invalid(_)), "{e}");
    assert!(!common::dir().join("bad.gguf").exists());
}
