//! The CPU backend against its single-threaded self: every op, weight type and KV type with all
//! cores and Q4_K repacking, and with one thread reading the rows as stored. Its results must not
//! depend on either.

hearth_backend_tests::conformance_suite!(hearth_backend_tests::CpuSubject);

/// The oracle itself: its MoE ops against the same FFN computed in f64.
#[test]
fn mixture_of_experts_match_a_host_reference() {
    hearth_backend_tests::experts::mixture_of_experts_match_a_host_reference();
}
