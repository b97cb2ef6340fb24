// The mat-muls' parameters (quant.wgsl `matmul`, matmul_q8.wgsl), appended to both files.
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
    // EXPERTS: experts chosen per token, and experts in the weight's binding (`rows` each)
    n_used: u32,
    n_expert: u32,
}
