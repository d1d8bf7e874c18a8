//! G1, G2 (with G19) and G3 at two compute threads: streamed == resident bit for bit where two
//! threads split every graph's work and the reader lanes run beside them. The only test of its
//! binary, so nothing else competes for this machine's two cores (the other gate binaries run one
//! compute thread per test for that reason: tests/common/gates.rs).
mod common;

#[test]
fn stream_gates_at_two_threads() {
    common::gates::set_threads(2);
    common::gates::stream_gates(&common::tiny());
}
