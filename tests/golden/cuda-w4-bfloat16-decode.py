
def jitconv_conv_w4_bfloat16_c2_l4_fastexp_r64_short1_g2_ew_gs_vt_ud(x, x_offset, x_row_stride, out, out_offset, out_row_stride,
           weight, weight_offset, weight_stride_c, weight_stride_k,
           bias, bias_offset, bias_stride,
           state, state_offset, state_stride_line, state_stride_c, state_stride_col,
           tables, rows, blocks, links, has_bias, silu, out2, out2_offset, out2_row_stride,
           split, spec_slot0, win, win_offset, win_stride_row, win_stride_step,
           win_stride_c, win_stride_col, dim, num_blocks):
    # rows, blocks: offsets of the per-call tables inside `tables` (jitconv.kernels.abi.TABLES);
    # a block's record holds BLOCK_FIELDS, its sequence's fields included.
    g = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x  # channel group
    b = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y  # block
    c = g * 2  # first of the work-item's channels
    if c >= dim or b >= num_blocks:
        return  # the grid is rounded up to whole thread blocks
    blk = blocks + b * 8
    t0 = tables[U(blk)]
    nb = tables[U(blk + 1)]
    line = tables[U(blk + 4)]
    flags = tables[U(blk + 6)]
    r0 = tables[U(blk + 7)]  # the row of the block's first token (consecutive rows)
    p0 = 0  # one block per sequence
    # Every sequence with a cache line holds one token and its window starts
    # at column 0 (the host checked the step): constants, so the window's
    # loads, the x load and the state stores wait for no field of the record.
    n = 1
    off = 0
    xc_0 = x_offset + c      # this channel in x and out
    oc_0 = out_offset + c
    xc_1 = x_offset + (c + 1)      # this channel in x and out
    oc_1 = out_offset + (c + 1)
    o = out  # the array this block's outputs go to, and its row stride
    ors = out_row_stride
    ob = -1  # out row r is x row r; split outputs: the block's first out row (its slot)
    if split:
        ob = t0
        if split == SPLIT_PARTS and flags & FLAG_SPEC:
            o = out2
            ors = out2_row_stride
            ob = t0 - spec_slot0
            oc_0 = out2_offset + c
            oc_1 = out2_offset + (c + 1)
    if line < 0:
        # Padded sequence, or output rows no sequence covers: zeros, no state access.
        if ob >= 0 and flags & FLAG_UNCOVERED:
            return  # rows of neither part: no split output has them
        for i in range(nb):
            r = r0 + i
            if not flags & FLAG_BLOCK_ROWS:
                r = tables[U(rows + t0 + i)]
            store_row2(o, U(oc_0 + (r if ob < 0 else ob + i) * ors), ZERO, ZERO)
        return

    wr0_0, wr1_0, wr2_0, wr3_0 = load_taps4(weight, U(weight_offset + c * 4))
    wr0_1, wr1_1, wr2_1, wr3_1 = load_taps4(weight, U(weight_offset + (c + 1) * 4))
    w0_0 = load(wr0_0)
    w0_1 = load(wr0_1)
    w1_0 = load(wr1_0)
    w1_1 = load(wr1_1)
    w2_0 = load(wr2_0)
    w2_1 = load(wr2_1)
    w3_0 = load(wr3_0)
    w3_1 = load(wr3_1)
    bias_c_0 = F32_ZERO
    bias_c_1 = F32_ZERO
    if has_bias:
        bias_c_0 = load(strided(bias, U(bias_offset + c * bias_stride)))
        bias_c_1 = load(strided(bias, U(bias_offset + (c + 1) * bias_stride)))
    first_slot = t0 - p0  # the sequence's first token slot
    initial = flags & FLAG_INITIAL_STATE
    base = -1  # the row of position 0 when the sequence's rows are consecutive
    if flags & FLAG_SEQ_ROWS:
        base = r0 - p0
    st_0 = state_offset + line * state_stride_line + c  # line, channel
    st_1 = state_offset + line * state_stride_line + (c + 1)  # line, channel
    sc = state_stride_col
    # The cache line's window (zeros without initial state): u0..u2.
    u0_0 = ZERO
    u0_1 = ZERO
    u1_0 = ZERO
    u1_1 = ZERO
    u2_0 = ZERO
    u2_1 = ZERO
    if initial:
        u0_0, u0_1 = load_row2(state, U(st_0 + (off + 0) * sc))
        u1_0, u1_1 = load_row2(state, U(st_0 + (off + 1) * sc))
        u2_0, u2_1 = load_row2(state, U(st_0 + (off + 2) * sc))
    # New state = concat(window, x_seq)[q0:] from column 0 (spec: q0 = 1, else n):
    # window columns from q0 on, then the tokens (loaded first: the stores may alias x
    # for the compiler).
    q0 = n
    if flags & FLAG_SPEC:
        q0 = 1
    rq0 = 0
    v0_0 = ZERO
    v0_1 = ZERO
    if n > 0:
        rq0 = base + 0
        if base < 0:
            rq0 = tables[U(rows + first_slot + 0)]
        v0_0, v0_1 = load_row2(x, U(xc_0 + rq0 * x_row_stride))
    if q0 <= 0:
        store_row2(state, U(st_0 + (0 - q0) * sc), u0_0, u0_1)
    if q0 <= 1:
        store_row2(state, U(st_0 + (1 - q0) * sc), u1_0, u1_1)
    if q0 <= 2:
        store_row2(state, U(st_0 + (2 - q0) * sc), u2_0, u2_1)
    if n > 0:
        store_row2(state, U(st_0 + (3 - q0) * sc), v0_0, v0_1)

    f0_0 = load(u0_0)
    f0_1 = load(u0_1)
    f1_0 = load(u1_0)
    f1_1 = load(u1_1)
    f2_0 = load(u2_0)
    f2_1 = load(u2_1)
    # Every token was loaded by the state update (v0..).
    if nb > 0:
        xs0_0 = load(v0_0)
        xs0_1 = load(v0_1)
        acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xs0_0
        acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xs0_1
        f0_0 = f1_0
        f1_0 = f2_0
        f2_0 = xs0_0
        f0_1 = f1_1
        f1_1 = f2_1
        f2_1 = xs0_1
        if silu:
            acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
            acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
        store_row2(o, U(oc_0 + (rq0 if ob < 0 else ob + 0) * ors), store(acc_0), store(acc_1))
