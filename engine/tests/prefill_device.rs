//! Prefill-device resolution and placement. The loopback device is an in-process ggml RPC server
//! fronting the CPU backend on 127.0.0.1 (same kernels: placement is the only difference).
mod common;

use bmoe_engine::ffi::registry::Device;
use bmoe_engine::ffi::rpc;
use bmoe_engine::{
    CancelToken, DecideRequest, GenerateOptions, LoadOptions, Model, PrefillOptions,
};

fn run(m: &Model) -> (Vec<u8>, Vec<u64>, u64) {
    let mut s = m
        .session(&bmoe_engine::SessionOptions {
            n_ubatch: 16,
            ..common::session_opts()
        })
        .unwrap();
    let g = s
        .generate(
            "Prefill placement",
            &GenerateOptions {
                n_predict: 12,
                ..Default::default()
            },
            &CancelToken::new(),
        )
        .unwrap();
    let d = s
        .decide(&DecideRequest {
            prefix: "Choose. ".repeat(10),
            suffix: "A or B?".into(),
            choices: vec!["A".into(), "B".into()],
        })
        .unwrap();
    (
        g.bytes,
        d.choice_logp.iter().map(|v| v.to_bits()).collect(),
        g.prefill_dev.tokens + d.prefill_dev.tokens,
    )
}

fn with_device(name: &str) -> LoadOptions {
    LoadOptions {
        prefill: Some(PrefillOptions {
            device: name.into(),
            min_tokens: 8,
            ..Default::default()
        }),
        ..LoadOptions::new(common::tiny())
    }
}

#[test]
fn an_unknown_device_leaves_the_run_on_the_cpu_and_says_so() {
    let cpu = run(&Model::load(&LoadOptions::new(common::tiny())).unwrap());
    let m = Model::load(&with_device("HTP0")).unwrap();
    assert_eq!(m.info().prefill_device, None);
    assert!(
        m.warnings()
            .iter()
            .any(|w| w.contains("HTP0 is not in this build's registry")),
        "{:?}",
        m.warnings()
    );
    let r = run(&m);
    assert_eq!(r.2, 0, "prefill_dev_tokens must stay 0");
    assert_eq!(r, cpu);
}

/// The loopback device (started once per test binary).
fn loopback() -> String {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        let endpoint =
            rpc::start_loopback_server(Device::cpu().unwrap(), 2).expect("loopback server");
        let devs = rpc::add_server(&endpoint).expect("add server");
        assert_eq!(devs.len(), 1);
        assert_eq!(devs[0].description, endpoint);
        devs[0].name.clone()
    })
    .clone()
}

/// G16/G17 on the resident model: generate bytes, perplexity bits and decision bits of a run
/// whose wide pieces go through the arena on the loopback device equal the all-CPU run.
#[test]
fn g16_g17_arena_on_the_loopback_device_equals_the_cpu() {
    let name = loopback();
    assert!(name.starts_with("RPC"), "{name}");
    let cpu_model = Model::load(&LoadOptions::new(common::tiny())).unwrap();
    let cpu = run(&cpu_model);
    let m = Model::load(&with_device(&name)).unwrap();
    assert_eq!(m.info().prefill_device.as_deref(), Some(name.as_str()));
    let dev = run(&m);
    assert!(dev.2 > 0, "wide pieces must run on the device");
    assert_eq!(
        (&dev.0, &dev.1),
        (&cpu.0, &cpu.1),
        "G16/G17: device prefill differs from the CPU"
    );
    let c = m.prefill_dev_counters();
    assert!(c.nodes > 0 && c.read_bytes > 0, "{c:?}");
    // Several calls in one session, and perplexity (every piece wide) too.
    let text = "Perplexity through the arena. ".repeat(4);
    let p_cpu = cpu_model
        .session(&common::session_opts())
        .unwrap()
        .perplexity(&text)
        .unwrap();
    let mut s = m.session(&common::session_opts()).unwrap();
    for _ in 0..2 {
        let p_dev = s.perplexity(&text).unwrap();
        assert_eq!(
            p_dev.nll_mean.to_bits(),
            p_cpu.nll_mean.to_bits(),
            "G16: perplexity differs"
        );
        assert!(p_dev.prefill_dev.tokens > 0);
    }
    // The arena reads the same bytes for the same work.
    let a = Model::load(&with_device(&name)).unwrap();
    run(&a);
    let b = Model::load(&with_device(&name)).unwrap();
    run(&b);
    assert_eq!(
        a.prefill_dev_counters().read_bytes,
        b.prefill_dev_counters().read_bytes
    );
}

#[test]
fn a_closed_rpc_port_is_refused_before_ggml_sees_it() {
    let e = rpc::add_server("127.0.0.1:1").err().unwrap();
    assert!(e.contains("cannot reach"), "{e}");
}
