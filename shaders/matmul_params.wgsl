// The mat-muls' parameters (quant.wgsl `matmul`, matmul_q8.wgsl) and their EXPERTS variant's ids,
// appended to both files.
// Mirrors kernel_params.rs (a test checks the fields).
struct MatMulParams {
    // the chunk's first weight row (a tensor too large for one binding is split into row ranges)
    row0: u32,
    // weight rows in the chunk
    rows: u32,
    // k: values in a weight row (and an activation row)
    row_len: u32,
    // bytes of a weight row as the file stores it
    row_bytes: u32,
    // output columns (the weight's rows)
    n: u32,
    n_tokens: u32,
    // the folded grid's x width
    groups_x: u32,
    // the word of the 8-bit activations where their scales start (act_quant.wgsl's layout)
    scales_at: u32,
    // SEGMENTS / SEGMENT3: per further segment, its first workgroup, weight rows, row bytes and
    // output columns
    seg1_first_group: u32,
    seg1_rows: u32,
    seg1_row_bytes: u32,
    seg1_n: u32,
    seg2_first_group: u32,
    seg2_rows: u32,
    seg2_row_bytes: u32,
    seg2_n: u32,
    // EXPERTS: experts chosen per token, experts of the weight (`rows` each), and whole experts a
    // binding holds (the last binding may hold fewer)
    n_used: u32,
    n_expert: u32,
    experts_per_binding: u32,
}

#ifdef EXPERTS || EXPERTS_GROUPED
// The activation row of (token, slot) pair `pair` of an expert mat-mul: the token's, or with
// PER_SLOT the pair's own slice of x. Its output row is the pair's own.
fn pair_act_row(pair: u32) -> u32 {
#ifdef PER_SLOT
    return pair;
#else
    return pair / P.n_used;
#endif
}
#endif

#ifdef EXPERTS
// [n_tokens * n_used] u32: each (token, slot) pair's expert, as route_experts wrote them
@group(0) @binding(10) var<storage, read> IDS: array<u32>;

// What the product of one (token, slot) pair of an EXPERTS mat-mul reads: its expert's weights
// and its activation row.
struct ExpertPair {
    expert: u32,
    act_row: u32,
}

fn expert_pair(pair: u32) -> ExpertPair {
    return ExpertPair(IDS[pair], pair_act_row(pair));
}
#endif
