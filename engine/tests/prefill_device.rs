//! Prefill-device resolution and placement. The loopback device is an in-process ggml RPC server
//! fronting the CPU backend on 127.0.0.1 (same kernels: placement is the only difference).
mod common;

use bmoe_engine::ffi::registry::Device;
use bmoe_engine::ffi::rpc;
use bmoe_engine::{
    CancelToken, DecideRequest, GenerateOptions, LoadOptions, Model, PrefillOptions,
};

fn run(m: &Model) -> (Vec<u8>, Vec<u64>, u64) {
    let mut s = m.session(&common::session_opts()).unwrap();
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

#[test]
fn the_loopback_device_joins_with_no_layer_and_changes_nothing() {
    let endpoint = rpc::start_loopback_server(Device::cpu().unwrap(), 2).expect("loopback server");
    let devs = rpc::add_server(&endpoint).expect("add server");
    assert_eq!(devs.len(), 1);
    let name = devs[0].name.clone();
    assert!(name.starts_with("RPC"), "{name}");
    assert_eq!(devs[0].description, endpoint);
    let cpu = run(&Model::load(&LoadOptions::new(common::tiny())).unwrap());
    let m = Model::load(&with_device(&name)).unwrap();
    assert_eq!(m.info().prefill_device.as_deref(), Some(name.as_str()));
    assert_eq!(
        run(&m),
        cpu,
        "a joined device with no layer assigned must not change results"
    );
    // A closed port is refused before ggml sees it (ggml would abort the process).
    let e = rpc::add_server("127.0.0.1:1").err().unwrap();
    assert!(e.contains("cannot reach"), "{e}");
}
