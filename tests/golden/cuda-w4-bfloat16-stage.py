
def jitconv_conv_w4_bfloat16_c4_l8_fastexp_r64_g2_vt_gdn(x, x_offset, x_row_stride, out, out_offset, out_row_stride,
           weight, weight_offset, weight_stride_c, weight_stride_k,
           bias, bias_offset, bias_stride,
           state, state_offset, state_stride_line, state_stride_c, state_stride_col,
           tables, rows, blocks, links, has_bias, silu, out2, out2_offset, out2_row_stride,
           split, spec_slot0, win, win_offset, win_stride_row, win_stride_step,
           win_stride_c, win_stride_col, dim, num_blocks, ga, ga_offset, ga_row_stride, gb, gb_offset, gb_row_stride, alog, alog_offset, dtb, dtb_offset, gates, gates_offset, gates2_offset, part_rows, part2_rows, qk, head_k, vdim, head_v, v_heads, head_k_magic, head_k_shift, head_v_magic, head_v_shift, l2norm_from, l2norm2_from, exp_g):
    # rows, blocks: offsets of the per-call tables inside `tables` (jitconv.kernels.abi.TABLES);
    # a block's record holds BLOCK_FIELDS, its sequence's fields included.
    g = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x  # channel group
    b = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y  # block
    c = g * 4  # first of the work-item's channels
    if c >= dim or b >= num_blocks:
        return  # the grid is rounded up to whole thread blocks
    blk = blocks + b * 8
    t0 = tables[U(blk)]
    nb = tables[U(blk + 1)]
    line = tables[U(blk + 4)]
    flags = tables[U(blk + 6)]
    r0 = tables[U(blk + 7)]  # the row of the block's first token (consecutive rows)
    p0 = tables[U(blk + 2)]  # position of the block's first token in its sequence
    n = tables[U(blk + 3)]
    off = tables[U(blk + 5)]
    xc_0 = x_offset + c      # this channel in x and out
    oc_0 = out_offset + c
    xc_1 = x_offset + (c + 1)      # this channel in x and out
    oc_1 = out_offset + (c + 1)
    xc_2 = x_offset + (c + 2)      # this channel in x and out
    oc_2 = out_offset + (c + 2)
    xc_3 = x_offset + (c + 3)      # this channel in x and out
    oc_3 = out_offset + (c + 3)
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
            oc_2 = out2_offset + (c + 2)
            oc_3 = out2_offset + (c + 3)
    # The GDN stage: q rows, then k rows, then v rows of the part's buffer.
    qk2 = 2 * qk
    sb = out_offset
    tp = part_rows
    go = gates_offset
    lfrom = l2norm_from
    if flags & FLAG_SPEC:
        sb = out2_offset
        tp = part2_rows
        go = gates2_offset
        lfrom = l2norm2_from
    ors = qk
    if c < qk:
        oc_0 = sb + c
        oc_1 = sb + (c + 1)
        oc_2 = sb + (c + 2)
        oc_3 = sb + (c + 3)
    elif c < qk2:
        oc_0 = sb + tp * qk + c - qk
        oc_1 = sb + tp * qk + (c + 1) - qk
        oc_2 = sb + tp * qk + (c + 2) - qk
        oc_3 = sb + tp * qk + (c + 3) - qk
    else:
        ors = vdim
        oc_0 = sb + tp * qk2 + c - qk2
        oc_1 = sb + tp * qk2 + (c + 1) - qk2
        oc_2 = sb + tp * qk2 + (c + 2) - qk2
        oc_3 = sb + tp * qk2 + (c + 3) - qk2
    if line < 0:
        # Padded sequence, or output rows no sequence covers: zeros, no state access.
        if ob >= 0 and flags & FLAG_UNCOVERED:
            return  # rows of neither part: no split output has them
        for i in range(nb):
            r = r0 + i
            if not flags & FLAG_BLOCK_ROWS:
                r = tables[U(rows + t0 + i)]
            store_row2(o, U(oc_0 + (r if ob < 0 else ob + i) * ors), ZERO, ZERO)
            store_row2(o, U(oc_2 + (r if ob < 0 else ob + i) * ors), ZERO, ZERO)
        if c >= qk2:
            hv = ((c - qk2) * head_v_magic) >> head_v_shift  # (c - qk2) // head_v
            nhv = v_heads
            ea = -gexp(alog[U(alog_offset + hv)])
            db = dtb[U(dtb_offset + hv)]
            for i in range((c - qk2 - hv * head_v) // 4, nb, head_v // 4):
                r = r0 + i
                if not flags & FLAG_BLOCK_ROWS:
                    r = tables[U(rows + t0 + i)]
                za = load(ga[U(ga_offset + r * ga_row_stride + hv)]) + db
                if za <= SOFTPLUS_THRESHOLD:
                    za = log1p(gexp(za))
                gv = ea * za
                if exp_g:
                    gv = gexp(gv)
                zb = load(gb[U(gb_offset + r * gb_row_stride + hv)])
                gs = go + (ob + i) * nhv + hv
                gates[U(gs)] = gv
                gates[U(gs + tp * nhv)] = fdiv(ONE, ONE + gexp(-zb))
        return

    first_slot = t0 - p0  # the sequence's first token slot
    initial = flags & FLAG_INITIAL_STATE
    base = -1  # the row of position 0 when the sequence's rows are consecutive
    if flags & FLAG_SEQ_ROWS:
        base = r0 - p0
    st_0 = state_offset + line * state_stride_line + c * state_stride_c  # line, channel
    st_1 = state_offset + line * state_stride_line + (c + 1) * state_stride_c  # line, channel
    st_2 = state_offset + line * state_stride_line + (c + 2) * state_stride_c  # line, channel
    st_3 = state_offset + line * state_stride_line + (c + 3) * state_stride_c  # line, channel
    sc = state_stride_col
    # u = concat(window, x_seq); u0..u2 hold u[p0 .. p0+S-1] as raw values.
    if p0 == 0:
        # The cache line's window (zeros without initial state).
        u0_0 = ZERO
        u0_1 = ZERO
        u0_2 = ZERO
        u0_3 = ZERO
        u1_0 = ZERO
        u1_1 = ZERO
        u1_2 = ZERO
        u1_3 = ZERO
        u2_0 = ZERO
        u2_1 = ZERO
        u2_2 = ZERO
        u2_3 = ZERO
        if initial:
            u0_0 = strided(state, U(st_0 + (off + 0) * sc))
            u0_1 = strided(state, U(st_1 + (off + 0) * sc))
            u0_2 = strided(state, U(st_2 + (off + 0) * sc))
            u0_3 = strided(state, U(st_3 + (off + 0) * sc))
            u1_0 = strided(state, U(st_0 + (off + 1) * sc))
            u1_1 = strided(state, U(st_1 + (off + 1) * sc))
            u1_2 = strided(state, U(st_2 + (off + 1) * sc))
            u1_3 = strided(state, U(st_3 + (off + 1) * sc))
            u2_0 = strided(state, U(st_0 + (off + 2) * sc))
            u2_1 = strided(state, U(st_1 + (off + 2) * sc))
            u2_2 = strided(state, U(st_2 + (off + 2) * sc))
            u2_3 = strided(state, U(st_3 + (off + 2) * sc))
    else:
        # p0 >= B >= 3: the window is the 3 rows of x before the block.
        rw0 = base + p0 - 3
        if base < 0:
            rw0 = tables[U(rows + t0 - 3)]
        rw1 = base + p0 - 2
        if base < 0:
            rw1 = tables[U(rows + t0 - 2)]
        rw2 = base + p0 - 1
        if base < 0:
            rw2 = tables[U(rows + t0 - 1)]
        u0_0, u0_1 = load_row2(x, U(xc_0 + rw0 * x_row_stride))
        u0_2, u0_3 = load_row2(x, U(xc_2 + rw0 * x_row_stride))
        u1_0, u1_1 = load_row2(x, U(xc_0 + rw1 * x_row_stride))
        u1_2, u1_3 = load_row2(x, U(xc_2 + rw1 * x_row_stride))
        u2_0, u2_1 = load_row2(x, U(xc_0 + rw2 * x_row_stride))
        u2_2, u2_3 = load_row2(x, U(xc_2 + rw2 * x_row_stride))
    short = False
    rq0 = 0
    rq1 = 0
    rq2 = 0
    rq3 = 0
    v0_0 = ZERO
    v0_1 = ZERO
    v0_2 = ZERO
    v0_3 = ZERO
    v1_0 = ZERO
    v1_1 = ZERO
    v1_2 = ZERO
    v1_3 = ZERO
    v2_0 = ZERO
    v2_1 = ZERO
    v2_2 = ZERO
    v2_3 = ZERO
    v3_0 = ZERO
    v3_1 = ZERO
    v3_2 = ZERO
    v3_3 = ZERO
    if p0 == 0:
        # Sole reader of this line's old window (per channel): write the new state.
        # New state = u[q0:] from column 0: spec keeps all but the oldest column
        # (S-1+n values), non-spec the last S. Columns from S - q0 on are rows of x
        # (positions q - S), read 4 at a time before they are stored.
        q0 = n
        if flags & FLAG_SPEC:
            q0 = 1
        q = max(q0, 3)
        short = n <= 4 and q == 3
        first = True
        while first or q < 3 + n:
            v0_0 = ZERO
            v0_1 = ZERO
            v0_2 = ZERO
            v0_3 = ZERO
            if q + 0 < 3 + n:
                rq0 = base + q + -3
                if base < 0:
                    rq0 = tables[U(rows + first_slot + q + -3)]
                v0_0, v0_1 = load_row2(x, U(xc_0 + rq0 * x_row_stride))
                v0_2, v0_3 = load_row2(x, U(xc_2 + rq0 * x_row_stride))
            v1_0 = ZERO
            v1_1 = ZERO
            v1_2 = ZERO
            v1_3 = ZERO
            if q + 1 < 3 + n:
                rq1 = base + q + -2
                if base < 0:
                    rq1 = tables[U(rows + first_slot + q + -2)]
                v1_0, v1_1 = load_row2(x, U(xc_0 + rq1 * x_row_stride))
                v1_2, v1_3 = load_row2(x, U(xc_2 + rq1 * x_row_stride))
            v2_0 = ZERO
            v2_1 = ZERO
            v2_2 = ZERO
            v2_3 = ZERO
            if q + 2 < 3 + n:
                rq2 = base + q + -1
                if base < 0:
                    rq2 = tables[U(rows + first_slot + q + -1)]
                v2_0, v2_1 = load_row2(x, U(xc_0 + rq2 * x_row_stride))
                v2_2, v2_3 = load_row2(x, U(xc_2 + rq2 * x_row_stride))
            v3_0 = ZERO
            v3_1 = ZERO
            v3_2 = ZERO
            v3_3 = ZERO
            if q + 3 < 3 + n:
                rq3 = base + q + 0
                if base < 0:
                    rq3 = tables[U(rows + first_slot + q + 0)]
                v3_0, v3_1 = load_row2(x, U(xc_0 + rq3 * x_row_stride))
                v3_2, v3_3 = load_row2(x, U(xc_2 + rq3 * x_row_stride))
            if first:
                if q0 <= 0:
                    state[U(st_0 + (0 - q0) * sc)] = u0_0
                    state[U(st_1 + (0 - q0) * sc)] = u0_1
                    state[U(st_2 + (0 - q0) * sc)] = u0_2
                    state[U(st_3 + (0 - q0) * sc)] = u0_3
                if q0 <= 1:
                    state[U(st_0 + (1 - q0) * sc)] = u1_0
                    state[U(st_1 + (1 - q0) * sc)] = u1_1
                    state[U(st_2 + (1 - q0) * sc)] = u1_2
                    state[U(st_3 + (1 - q0) * sc)] = u1_3
                if q0 <= 2:
                    state[U(st_0 + (2 - q0) * sc)] = u2_0
                    state[U(st_1 + (2 - q0) * sc)] = u2_1
                    state[U(st_2 + (2 - q0) * sc)] = u2_2
                    state[U(st_3 + (2 - q0) * sc)] = u2_3
                first = False
            if q + 0 < 3 + n:
                state[U(st_0 + (q + 0 - q0) * sc)] = v0_0
                state[U(st_1 + (q + 0 - q0) * sc)] = v0_1
                state[U(st_2 + (q + 0 - q0) * sc)] = v0_2
                state[U(st_3 + (q + 0 - q0) * sc)] = v0_3
            if q + 1 < 3 + n:
                state[U(st_0 + (q + 1 - q0) * sc)] = v1_0
                state[U(st_1 + (q + 1 - q0) * sc)] = v1_1
                state[U(st_2 + (q + 1 - q0) * sc)] = v1_2
                state[U(st_3 + (q + 1 - q0) * sc)] = v1_3
            if q + 2 < 3 + n:
                state[U(st_0 + (q + 2 - q0) * sc)] = v2_0
                state[U(st_1 + (q + 2 - q0) * sc)] = v2_1
                state[U(st_2 + (q + 2 - q0) * sc)] = v2_2
                state[U(st_3 + (q + 2 - q0) * sc)] = v2_3
            if q + 3 < 3 + n:
                state[U(st_0 + (q + 3 - q0) * sc)] = v3_0
                state[U(st_1 + (q + 3 - q0) * sc)] = v3_1
                state[U(st_2 + (q + 3 - q0) * sc)] = v3_2
                state[U(st_3 + (q + 3 - q0) * sc)] = v3_3
            q += 4

    wr0_0, wr1_0, wr2_0, wr3_0 = load_taps4(weight, U(weight_offset + c * 4))
    wr0_1, wr1_1, wr2_1, wr3_1 = load_taps4(weight, U(weight_offset + (c + 1) * 4))
    wr0_2, wr1_2, wr2_2, wr3_2 = load_taps4(weight, U(weight_offset + (c + 2) * 4))
    wr0_3, wr1_3, wr2_3, wr3_3 = load_taps4(weight, U(weight_offset + (c + 3) * 4))
    w0_0 = load(wr0_0)
    w0_1 = load(wr0_1)
    w0_2 = load(wr0_2)
    w0_3 = load(wr0_3)
    w1_0 = load(wr1_0)
    w1_1 = load(wr1_1)
    w1_2 = load(wr1_2)
    w1_3 = load(wr1_3)
    w2_0 = load(wr2_0)
    w2_1 = load(wr2_1)
    w2_2 = load(wr2_2)
    w2_3 = load(wr2_3)
    w3_0 = load(wr3_0)
    w3_1 = load(wr3_1)
    w3_2 = load(wr3_2)
    w3_3 = load(wr3_3)
    bias_c_0 = F32_ZERO
    bias_c_1 = F32_ZERO
    bias_c_2 = F32_ZERO
    bias_c_3 = F32_ZERO
    if has_bias:
        bias_c_0 = load(strided(bias, U(bias_offset + c * bias_stride)))
        bias_c_1 = load(strided(bias, U(bias_offset + (c + 1) * bias_stride)))
        bias_c_2 = load(strided(bias, U(bias_offset + (c + 2) * bias_stride)))
        bias_c_3 = load(strided(bias, U(bias_offset + (c + 3) * bias_stride)))
    f0_0 = load(u0_0)
    f0_1 = load(u0_1)
    f0_2 = load(u0_2)
    f0_3 = load(u0_3)
    f1_0 = load(u1_0)
    f1_1 = load(u1_1)
    f1_2 = load(u1_2)
    f1_3 = load(u1_3)
    f2_0 = load(u2_0)
    f2_1 = load(u2_1)
    f2_2 = load(u2_2)
    f2_3 = load(u2_3)
    if short:
        # The state update's first round loaded every token of the block (v0..): no reload after its stores.
        if nb > 0:
            xs0_0 = load(v0_0)
            xs0_1 = load(v0_1)
            xs0_2 = load(v0_2)
            xs0_3 = load(v0_3)
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xs0_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xs0_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xs0_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xs0_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xs0_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xs0_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xs0_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xs0_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (rq0 if ob < 0 else ob + 0) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (rq0 if ob < 0 else ob + 0) * ors), store(acc_2), store(acc_3))
            if nb > 1:
                xs1_0 = load(v1_0)
                xs1_1 = load(v1_1)
                xs1_2 = load(v1_2)
                xs1_3 = load(v1_3)
                acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xs1_0
                acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xs1_1
                acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xs1_2
                acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xs1_3
                f0_0 = f1_0
                f1_0 = f2_0
                f2_0 = xs1_0
                f0_1 = f1_1
                f1_1 = f2_1
                f2_1 = xs1_1
                f0_2 = f1_2
                f1_2 = f2_2
                f2_2 = xs1_2
                f0_3 = f1_3
                f1_3 = f2_3
                f2_3 = xs1_3
                if silu:
                    acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                    acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                    acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                    acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
                if c < qk2 and ob >= lfrom:
                    ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                    ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                    acc_0 = acc_0 * ss
                    acc_1 = acc_1 * ss
                    acc_2 = acc_2 * ss
                    acc_3 = acc_3 * ss
                store_row2(o, U(oc_0 + (rq1 if ob < 0 else ob + 1) * ors), store(acc_0), store(acc_1))
                store_row2(o, U(oc_2 + (rq1 if ob < 0 else ob + 1) * ors), store(acc_2), store(acc_3))
                if nb > 2:
                    xs2_0 = load(v2_0)
                    xs2_1 = load(v2_1)
                    xs2_2 = load(v2_2)
                    xs2_3 = load(v2_3)
                    acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xs2_0
                    acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xs2_1
                    acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xs2_2
                    acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xs2_3
                    f0_0 = f1_0
                    f1_0 = f2_0
                    f2_0 = xs2_0
                    f0_1 = f1_1
                    f1_1 = f2_1
                    f2_1 = xs2_1
                    f0_2 = f1_2
                    f1_2 = f2_2
                    f2_2 = xs2_2
                    f0_3 = f1_3
                    f1_3 = f2_3
                    f2_3 = xs2_3
                    if silu:
                        acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                        acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                        acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                        acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
                    if c < qk2 and ob >= lfrom:
                        ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                        ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                        acc_0 = acc_0 * ss
                        acc_1 = acc_1 * ss
                        acc_2 = acc_2 * ss
                        acc_3 = acc_3 * ss
                    store_row2(o, U(oc_0 + (rq2 if ob < 0 else ob + 2) * ors), store(acc_0), store(acc_1))
                    store_row2(o, U(oc_2 + (rq2 if ob < 0 else ob + 2) * ors), store(acc_2), store(acc_3))
                    if nb > 3:
                        xs3_0 = load(v3_0)
                        xs3_1 = load(v3_1)
                        xs3_2 = load(v3_2)
                        xs3_3 = load(v3_3)
                        acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xs3_0
                        acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xs3_1
                        acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xs3_2
                        acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xs3_3
                        f0_0 = f1_0
                        f1_0 = f2_0
                        f2_0 = xs3_0
                        f0_1 = f1_1
                        f1_1 = f2_1
                        f2_1 = xs3_1
                        f0_2 = f1_2
                        f1_2 = f2_2
                        f2_2 = xs3_2
                        f0_3 = f1_3
                        f1_3 = f2_3
                        f2_3 = xs3_3
                        if silu:
                            acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                            acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                            acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                            acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
                        if c < qk2 and ob >= lfrom:
                            ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                            ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                            acc_0 = acc_0 * ss
                            acc_1 = acc_1 * ss
                            acc_2 = acc_2 * ss
                            acc_3 = acc_3 * ss
                        store_row2(o, U(oc_0 + (rq3 if ob < 0 else ob + 3) * ors), store(acc_0), store(acc_1))
                        store_row2(o, U(oc_2 + (rq3 if ob < 0 else ob + 3) * ors), store(acc_2), store(acc_3))
    elif flags & FLAG_BLOCK_ROWS:
        i = 0
        while i + 8 <= nb:
            ra0 = r0 + i + 0
            ra1 = r0 + i + 1
            ra2 = r0 + i + 2
            ra3 = r0 + i + 3
            ra4 = r0 + i + 4
            ra5 = r0 + i + 5
            ra6 = r0 + i + 6
            ra7 = r0 + i + 7
            r_xg0_0, r_xg0_1 = load_row2(x, U(xc_0 + ra0 * x_row_stride))
            r_xg0_2, r_xg0_3 = load_row2(x, U(xc_2 + ra0 * x_row_stride))
            xg0_0 = load(r_xg0_0)
            xg0_1 = load(r_xg0_1)
            xg0_2 = load(r_xg0_2)
            xg0_3 = load(r_xg0_3)
            r_xg1_0, r_xg1_1 = load_row2(x, U(xc_0 + ra1 * x_row_stride))
            r_xg1_2, r_xg1_3 = load_row2(x, U(xc_2 + ra1 * x_row_stride))
            xg1_0 = load(r_xg1_0)
            xg1_1 = load(r_xg1_1)
            xg1_2 = load(r_xg1_2)
            xg1_3 = load(r_xg1_3)
            r_xg2_0, r_xg2_1 = load_row2(x, U(xc_0 + ra2 * x_row_stride))
            r_xg2_2, r_xg2_3 = load_row2(x, U(xc_2 + ra2 * x_row_stride))
            xg2_0 = load(r_xg2_0)
            xg2_1 = load(r_xg2_1)
            xg2_2 = load(r_xg2_2)
            xg2_3 = load(r_xg2_3)
            r_xg3_0, r_xg3_1 = load_row2(x, U(xc_0 + ra3 * x_row_stride))
            r_xg3_2, r_xg3_3 = load_row2(x, U(xc_2 + ra3 * x_row_stride))
            xg3_0 = load(r_xg3_0)
            xg3_1 = load(r_xg3_1)
            xg3_2 = load(r_xg3_2)
            xg3_3 = load(r_xg3_3)
            r_xg4_0, r_xg4_1 = load_row2(x, U(xc_0 + ra4 * x_row_stride))
            r_xg4_2, r_xg4_3 = load_row2(x, U(xc_2 + ra4 * x_row_stride))
            xg4_0 = load(r_xg4_0)
            xg4_1 = load(r_xg4_1)
            xg4_2 = load(r_xg4_2)
            xg4_3 = load(r_xg4_3)
            r_xg5_0, r_xg5_1 = load_row2(x, U(xc_0 + ra5 * x_row_stride))
            r_xg5_2, r_xg5_3 = load_row2(x, U(xc_2 + ra5 * x_row_stride))
            xg5_0 = load(r_xg5_0)
            xg5_1 = load(r_xg5_1)
            xg5_2 = load(r_xg5_2)
            xg5_3 = load(r_xg5_3)
            r_xg6_0, r_xg6_1 = load_row2(x, U(xc_0 + ra6 * x_row_stride))
            r_xg6_2, r_xg6_3 = load_row2(x, U(xc_2 + ra6 * x_row_stride))
            xg6_0 = load(r_xg6_0)
            xg6_1 = load(r_xg6_1)
            xg6_2 = load(r_xg6_2)
            xg6_3 = load(r_xg6_3)
            r_xg7_0, r_xg7_1 = load_row2(x, U(xc_0 + ra7 * x_row_stride))
            r_xg7_2, r_xg7_3 = load_row2(x, U(xc_2 + ra7 * x_row_stride))
            xg7_0 = load(r_xg7_0)
            xg7_1 = load(r_xg7_1)
            xg7_2 = load(r_xg7_2)
            xg7_3 = load(r_xg7_3)
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg0_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg0_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg0_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg0_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg0_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg0_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg0_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg0_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra0 if ob < 0 else ob + i + 0) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra0 if ob < 0 else ob + i + 0) * ors), store(acc_2), store(acc_3))
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg1_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg1_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg1_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg1_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg1_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg1_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg1_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg1_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra1 if ob < 0 else ob + i + 1) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra1 if ob < 0 else ob + i + 1) * ors), store(acc_2), store(acc_3))
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg2_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg2_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg2_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg2_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg2_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg2_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg2_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg2_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra2 if ob < 0 else ob + i + 2) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra2 if ob < 0 else ob + i + 2) * ors), store(acc_2), store(acc_3))
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg3_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg3_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg3_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg3_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg3_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg3_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg3_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg3_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra3 if ob < 0 else ob + i + 3) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra3 if ob < 0 else ob + i + 3) * ors), store(acc_2), store(acc_3))
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg4_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg4_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg4_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg4_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg4_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg4_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg4_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg4_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra4 if ob < 0 else ob + i + 4) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra4 if ob < 0 else ob + i + 4) * ors), store(acc_2), store(acc_3))
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg5_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg5_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg5_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg5_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg5_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg5_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg5_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg5_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra5 if ob < 0 else ob + i + 5) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra5 if ob < 0 else ob + i + 5) * ors), store(acc_2), store(acc_3))
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg6_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg6_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg6_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg6_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg6_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg6_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg6_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg6_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra6 if ob < 0 else ob + i + 6) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra6 if ob < 0 else ob + i + 6) * ors), store(acc_2), store(acc_3))
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg7_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg7_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg7_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg7_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg7_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg7_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg7_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg7_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra7 if ob < 0 else ob + i + 7) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra7 if ob < 0 else ob + i + 7) * ors), store(acc_2), store(acc_3))
            i += 8
        if i + 4 <= nb:
            ra0 = r0 + i + 0
            ra1 = r0 + i + 1
            ra2 = r0 + i + 2
            ra3 = r0 + i + 3
            r_xg0_0, r_xg0_1 = load_row2(x, U(xc_0 + ra0 * x_row_stride))
            r_xg0_2, r_xg0_3 = load_row2(x, U(xc_2 + ra0 * x_row_stride))
            xg0_0 = load(r_xg0_0)
            xg0_1 = load(r_xg0_1)
            xg0_2 = load(r_xg0_2)
            xg0_3 = load(r_xg0_3)
            r_xg1_0, r_xg1_1 = load_row2(x, U(xc_0 + ra1 * x_row_stride))
            r_xg1_2, r_xg1_3 = load_row2(x, U(xc_2 + ra1 * x_row_stride))
            xg1_0 = load(r_xg1_0)
            xg1_1 = load(r_xg1_1)
            xg1_2 = load(r_xg1_2)
            xg1_3 = load(r_xg1_3)
            r_xg2_0, r_xg2_1 = load_row2(x, U(xc_0 + ra2 * x_row_stride))
            r_xg2_2, r_xg2_3 = load_row2(x, U(xc_2 + ra2 * x_row_stride))
            xg2_0 = load(r_xg2_0)
            xg2_1 = load(r_xg2_1)
            xg2_2 = load(r_xg2_2)
            xg2_3 = load(r_xg2_3)
            r_xg3_0, r_xg3_1 = load_row2(x, U(xc_0 + ra3 * x_row_stride))
            r_xg3_2, r_xg3_3 = load_row2(x, U(xc_2 + ra3 * x_row_stride))
            xg3_0 = load(r_xg3_0)
            xg3_1 = load(r_xg3_1)
            xg3_2 = load(r_xg3_2)
            xg3_3 = load(r_xg3_3)
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg0_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg0_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg0_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg0_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg0_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg0_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg0_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg0_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra0 if ob < 0 else ob + i + 0) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra0 if ob < 0 else ob + i + 0) * ors), store(acc_2), store(acc_3))
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg1_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg1_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg1_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg1_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg1_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg1_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg1_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg1_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra1 if ob < 0 else ob + i + 1) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra1 if ob < 0 else ob + i + 1) * ors), store(acc_2), store(acc_3))
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg2_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg2_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg2_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg2_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg2_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg2_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg2_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg2_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra2 if ob < 0 else ob + i + 2) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra2 if ob < 0 else ob + i + 2) * ors), store(acc_2), store(acc_3))
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg3_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg3_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg3_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg3_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg3_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg3_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg3_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg3_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra3 if ob < 0 else ob + i + 3) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra3 if ob < 0 else ob + i + 3) * ors), store(acc_2), store(acc_3))
            i += 4
        for i in range(i, nb):
            r = r0 + i
            r_xf_0, r_xf_1 = load_row2(x, U(xc_0 + r * x_row_stride))
            r_xf_2, r_xf_3 = load_row2(x, U(xc_2 + r * x_row_stride))
            xf_0 = load(r_xf_0)
            xf_1 = load(r_xf_1)
            xf_2 = load(r_xf_2)
            xf_3 = load(r_xf_3)
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xf_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xf_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xf_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xf_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xf_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xf_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xf_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xf_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (r if ob < 0 else ob + i) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (r if ob < 0 else ob + i) * ors), store(acc_2), store(acc_3))
    else:
        i = 0
        while i + 8 <= nb:
            ra0 = tables[U(rows + t0 + i + 0)]
            ra1 = tables[U(rows + t0 + i + 1)]
            ra2 = tables[U(rows + t0 + i + 2)]
            ra3 = tables[U(rows + t0 + i + 3)]
            ra4 = tables[U(rows + t0 + i + 4)]
            ra5 = tables[U(rows + t0 + i + 5)]
            ra6 = tables[U(rows + t0 + i + 6)]
            ra7 = tables[U(rows + t0 + i + 7)]
            r_xg0_0, r_xg0_1 = load_row2(x, U(xc_0 + ra0 * x_row_stride))
            r_xg0_2, r_xg0_3 = load_row2(x, U(xc_2 + ra0 * x_row_stride))
            xg0_0 = load(r_xg0_0)
            xg0_1 = load(r_xg0_1)
            xg0_2 = load(r_xg0_2)
            xg0_3 = load(r_xg0_3)
            r_xg1_0, r_xg1_1 = load_row2(x, U(xc_0 + ra1 * x_row_stride))
            r_xg1_2, r_xg1_3 = load_row2(x, U(xc_2 + ra1 * x_row_stride))
            xg1_0 = load(r_xg1_0)
            xg1_1 = load(r_xg1_1)
            xg1_2 = load(r_xg1_2)
            xg1_3 = load(r_xg1_3)
            r_xg2_0, r_xg2_1 = load_row2(x, U(xc_0 + ra2 * x_row_stride))
            r_xg2_2, r_xg2_3 = load_row2(x, U(xc_2 + ra2 * x_row_stride))
            xg2_0 = load(r_xg2_0)
            xg2_1 = load(r_xg2_1)
            xg2_2 = load(r_xg2_2)
            xg2_3 = load(r_xg2_3)
            r_xg3_0, r_xg3_1 = load_row2(x, U(xc_0 + ra3 * x_row_stride))
            r_xg3_2, r_xg3_3 = load_row2(x, U(xc_2 + ra3 * x_row_stride))
            xg3_0 = load(r_xg3_0)
            xg3_1 = load(r_xg3_1)
            xg3_2 = load(r_xg3_2)
            xg3_3 = load(r_xg3_3)
            r_xg4_0, r_xg4_1 = load_row2(x, U(xc_0 + ra4 * x_row_stride))
            r_xg4_2, r_xg4_3 = load_row2(x, U(xc_2 + ra4 * x_row_stride))
            xg4_0 = load(r_xg4_0)
            xg4_1 = load(r_xg4_1)
            xg4_2 = load(r_xg4_2)
            xg4_3 = load(r_xg4_3)
            r_xg5_0, r_xg5_1 = load_row2(x, U(xc_0 + ra5 * x_row_stride))
            r_xg5_2, r_xg5_3 = load_row2(x, U(xc_2 + ra5 * x_row_stride))
            xg5_0 = load(r_xg5_0)
            xg5_1 = load(r_xg5_1)
            xg5_2 = load(r_xg5_2)
            xg5_3 = load(r_xg5_3)
            r_xg6_0, r_xg6_1 = load_row2(x, U(xc_0 + ra6 * x_row_stride))
            r_xg6_2, r_xg6_3 = load_row2(x, U(xc_2 + ra6 * x_row_stride))
            xg6_0 = load(r_xg6_0)
            xg6_1 = load(r_xg6_1)
            xg6_2 = load(r_xg6_2)
            xg6_3 = load(r_xg6_3)
            r_xg7_0, r_xg7_1 = load_row2(x, U(xc_0 + ra7 * x_row_stride))
            r_xg7_2, r_xg7_3 = load_row2(x, U(xc_2 + ra7 * x_row_stride))
            xg7_0 = load(r_xg7_0)
            xg7_1 = load(r_xg7_1)
            xg7_2 = load(r_xg7_2)
            xg7_3 = load(r_xg7_3)
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg0_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg0_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg0_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg0_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg0_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg0_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg0_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg0_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra0 if ob < 0 else ob + i + 0) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra0 if ob < 0 else ob + i + 0) * ors), store(acc_2), store(acc_3))
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg1_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg1_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg1_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg1_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg1_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg1_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg1_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg1_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra1 if ob < 0 else ob + i + 1) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra1 if ob < 0 else ob + i + 1) * ors), store(acc_2), store(acc_3))
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg2_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg2_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg2_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg2_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg2_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg2_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg2_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg2_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra2 if ob < 0 else ob + i + 2) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra2 if ob < 0 else ob + i + 2) * ors), store(acc_2), store(acc_3))
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg3_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg3_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg3_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg3_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg3_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg3_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg3_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg3_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra3 if ob < 0 else ob + i + 3) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra3 if ob < 0 else ob + i + 3) * ors), store(acc_2), store(acc_3))
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg4_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg4_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg4_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg4_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg4_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg4_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg4_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg4_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra4 if ob < 0 else ob + i + 4) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra4 if ob < 0 else ob + i + 4) * ors), store(acc_2), store(acc_3))
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg5_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg5_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg5_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg5_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg5_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg5_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg5_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg5_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra5 if ob < 0 else ob + i + 5) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra5 if ob < 0 else ob + i + 5) * ors), store(acc_2), store(acc_3))
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg6_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg6_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg6_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg6_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg6_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg6_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg6_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg6_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra6 if ob < 0 else ob + i + 6) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra6 if ob < 0 else ob + i + 6) * ors), store(acc_2), store(acc_3))
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg7_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg7_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg7_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg7_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg7_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg7_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg7_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg7_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra7 if ob < 0 else ob + i + 7) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra7 if ob < 0 else ob + i + 7) * ors), store(acc_2), store(acc_3))
            i += 8
        if i + 4 <= nb:
            ra0 = tables[U(rows + t0 + i + 0)]
            ra1 = tables[U(rows + t0 + i + 1)]
            ra2 = tables[U(rows + t0 + i + 2)]
            ra3 = tables[U(rows + t0 + i + 3)]
            r_xg0_0, r_xg0_1 = load_row2(x, U(xc_0 + ra0 * x_row_stride))
            r_xg0_2, r_xg0_3 = load_row2(x, U(xc_2 + ra0 * x_row_stride))
            xg0_0 = load(r_xg0_0)
            xg0_1 = load(r_xg0_1)
            xg0_2 = load(r_xg0_2)
            xg0_3 = load(r_xg0_3)
            r_xg1_0, r_xg1_1 = load_row2(x, U(xc_0 + ra1 * x_row_stride))
            r_xg1_2, r_xg1_3 = load_row2(x, U(xc_2 + ra1 * x_row_stride))
            xg1_0 = load(r_xg1_0)
            xg1_1 = load(r_xg1_1)
            xg1_2 = load(r_xg1_2)
            xg1_3 = load(r_xg1_3)
            r_xg2_0, r_xg2_1 = load_row2(x, U(xc_0 + ra2 * x_row_stride))
            r_xg2_2, r_xg2_3 = load_row2(x, U(xc_2 + ra2 * x_row_stride))
            xg2_0 = load(r_xg2_0)
            xg2_1 = load(r_xg2_1)
            xg2_2 = load(r_xg2_2)
            xg2_3 = load(r_xg2_3)
            r_xg3_0, r_xg3_1 = load_row2(x, U(xc_0 + ra3 * x_row_stride))
            r_xg3_2, r_xg3_3 = load_row2(x, U(xc_2 + ra3 * x_row_stride))
            xg3_0 = load(r_xg3_0)
            xg3_1 = load(r_xg3_1)
            xg3_2 = load(r_xg3_2)
            xg3_3 = load(r_xg3_3)
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg0_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg0_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg0_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg0_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg0_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg0_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg0_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg0_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra0 if ob < 0 else ob + i + 0) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra0 if ob < 0 else ob + i + 0) * ors), store(acc_2), store(acc_3))
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg1_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg1_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg1_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg1_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg1_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg1_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg1_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg1_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra1 if ob < 0 else ob + i + 1) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra1 if ob < 0 else ob + i + 1) * ors), store(acc_2), store(acc_3))
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg2_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg2_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg2_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg2_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg2_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg2_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg2_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg2_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra2 if ob < 0 else ob + i + 2) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra2 if ob < 0 else ob + i + 2) * ors), store(acc_2), store(acc_3))
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xg3_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xg3_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xg3_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xg3_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xg3_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xg3_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xg3_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xg3_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (ra3 if ob < 0 else ob + i + 3) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (ra3 if ob < 0 else ob + i + 3) * ors), store(acc_2), store(acc_3))
            i += 4
        for i in range(i, nb):
            r = tables[U(rows + t0 + i)]
            r_xf_0, r_xf_1 = load_row2(x, U(xc_0 + r * x_row_stride))
            r_xf_2, r_xf_3 = load_row2(x, U(xc_2 + r * x_row_stride))
            xf_0 = load(r_xf_0)
            xf_1 = load(r_xf_1)
            xf_2 = load(r_xf_2)
            xf_3 = load(r_xf_3)
            acc_0 = bias_c_0 + w0_0 * f0_0 + w1_0 * f1_0 + w2_0 * f2_0 + w3_0 * xf_0
            acc_1 = bias_c_1 + w0_1 * f0_1 + w1_1 * f1_1 + w2_1 * f2_1 + w3_1 * xf_1
            acc_2 = bias_c_2 + w0_2 * f0_2 + w1_2 * f1_2 + w2_2 * f2_2 + w3_2 * xf_2
            acc_3 = bias_c_3 + w0_3 * f0_3 + w1_3 * f1_3 + w2_3 * f2_3 + w3_3 * xf_3
            f0_0 = f1_0
            f1_0 = f2_0
            f2_0 = xf_0
            f0_1 = f1_1
            f1_1 = f2_1
            f2_1 = xf_1
            f0_2 = f1_2
            f1_2 = f2_2
            f2_2 = xf_2
            f0_3 = f1_3
            f1_3 = f2_3
            f2_3 = xf_3
            if silu:
                acc_0 = fdiv(acc_0, ONE + exp(-acc_0))
                acc_1 = fdiv(acc_1, ONE + exp(-acc_1))
                acc_2 = fdiv(acc_2, ONE + exp(-acc_2))
                acc_3 = fdiv(acc_3, ONE + exp(-acc_3))
            if c < qk2 and ob >= lfrom:
                ss = lane_sum(acc_0 * acc_0 + acc_1 * acc_1 + acc_2 * acc_2 + acc_3 * acc_3)
                ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
                acc_0 = acc_0 * ss
                acc_1 = acc_1 * ss
                acc_2 = acc_2 * ss
                acc_3 = acc_3 * ss
            store_row2(o, U(oc_0 + (r if ob < 0 else ob + i) * ors), store(acc_0), store(acc_1))
            store_row2(o, U(oc_2 + (r if ob < 0 else ob + i) * ors), store(acc_2), store(acc_3))
    if c >= qk2:
        hv = ((c - qk2) * head_v_magic) >> head_v_shift  # (c - qk2) // head_v
        nhv = v_heads
        ea = -gexp(alog[U(alog_offset + hv)])
        db = dtb[U(dtb_offset + hv)]
        for i in range((c - qk2 - hv * head_v) // 4, nb, head_v // 4):
            r = r0 + i
            if not flags & FLAG_BLOCK_ROWS:
                r = tables[U(rows + t0 + i)]
            za = load(ga[U(ga_offset + r * ga_row_stride + hv)]) + db
            if za <= SOFTPLUS_THRESHOLD:
                za = log1p(gexp(za))
            gv = ea * za
            if exp_g:
                gv = gexp(gv)
            zb = load(gb[U(gb_offset + r * gb_row_stride + hv)])
            gs = go + (ob + i) * nhv + hv
            gates[U(gs)] = gv
            gates[U(gs + tp * nhv)] = fdiv(ONE, ONE + gexp(-zb))
