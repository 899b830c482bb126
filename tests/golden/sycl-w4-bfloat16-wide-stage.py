
def jitconv_conv_w4_bfloat16_fast_wide_gdn(item, x, x_offset, x_row_stride, out, out_offset, out_row_stride,
           weight, weight_offset, weight_stride_c, weight_stride_k,
           bias, bias_offset, bias_stride,
           state, state_offset, state_stride_line, state_stride_c, state_stride_col,
           tables, rows, blocks, links, has_bias, silu, out2, out2_offset, out2_row_stride,
           split, spec_slot0, win, win_offset, win_stride_row, win_stride_step,
           win_stride_c, win_stride_col, ga, ga_offset, ga_row_stride, gb, gb_offset, gb_row_stride, alog, alog_offset, dtb, dtb_offset, gates, gates_offset, gates2_offset, part_rows, part2_rows, qk, head_k, vdim, head_v, v_heads, head_k_magic, head_k_shift, head_v_magic, head_v_shift, l2norm_from, l2norm2_from, exp_g):
    # rows, blocks: offsets of the per-call tables inside `tables` (jitconv.kernels.abi.TABLES);
    # a block's record holds BLOCK_FIELDS, its sequence's fields included.
    c = item.get_global_id(0) * 4  # first channel: the fastest index
    b = item.get_global_id(1)  # block
    if c >= 2 * qk + vdim:
        return  # the range is rounded up to whole work-groups (v heads only)
    blk = blocks + b * 8
    t0 = tables[U(blk)]
    nb = tables[U(blk + 1)]
    line = tables[U(blk + 4)]
    flags = tables[U(blk + 6)]
    r0 = tables[U(blk + 7)]  # the row of the block's first token (consecutive rows)
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
            store_row4(o, U(oc_0 + (r if ob < 0 else ob + i) * ors), ZERO, ZERO, ZERO, ZERO)
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

    p0 = tables[U(blk + 2)]  # position of the block's first token in its sequence
    n = tables[U(blk + 3)]
    off = tables[U(blk + 5)]
    first_slot = t0 - p0  # the sequence's first token slot
    initial = flags & FLAG_INITIAL_STATE
    base = -1  # the row of position 0 when the sequence's rows are consecutive
    if flags & FLAG_SEQ_ROWS:
        base = r0 - p0
    st_0 = state_offset + line * state_stride_line + c  # line, channel
    st_1 = state_offset + line * state_stride_line + (c + 1)  # line, channel
    st_2 = state_offset + line * state_stride_line + (c + 2)  # line, channel
    st_3 = state_offset + line * state_stride_line + (c + 3)  # line, channel
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
            u0_0, u0_1, u0_2, u0_3 = load_row4(state, U(st_0 + (off + 0) * sc))
            u1_0, u1_1, u1_2, u1_3 = load_row4(state, U(st_0 + (off + 1) * sc))
            u2_0, u2_1, u2_2, u2_3 = load_row4(state, U(st_0 + (off + 2) * sc))
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
        u0_0, u0_1, u0_2, u0_3 = load_row4(x, U(xc_0 + rw0 * x_row_stride))
        u1_0, u1_1, u1_2, u1_3 = load_row4(x, U(xc_0 + rw1 * x_row_stride))
        u2_0, u2_1, u2_2, u2_3 = load_row4(x, U(xc_0 + rw2 * x_row_stride))
    if p0 == 0:
        # Sole reader of this line's old window (per channel): write the new state.
        # New state = u[q0:] from column 0: spec keeps all but the oldest column
        # (S-1+n values), non-spec the last S. Columns from S - q0 on are rows of x
        # (positions q - S), read 3 at a time before they are stored.
        q0 = n
        if flags & FLAG_SPEC:
            q0 = 1
        q = max(q0, 3)
        first = True
        while first or q < 3 + n:
            v0_0 = ZERO
            v0_1 = ZERO
            v0_2 = ZERO
            v0_3 = ZERO
            if q + 0 < 3 + n:
                rq = base + q + -3
                if base < 0:
                    rq = tables[U(rows + first_slot + q + -3)]
                v0_0, v0_1, v0_2, v0_3 = load_row4(x, U(xc_0 + rq * x_row_stride))
            v1_0 = ZERO
            v1_1 = ZERO
            v1_2 = ZERO
            v1_3 = ZERO
            if q + 1 < 3 + n:
                rq = base + q + -2
                if base < 0:
                    rq = tables[U(rows + first_slot + q + -2)]
                v1_0, v1_1, v1_2, v1_3 = load_row4(x, U(xc_0 + rq * x_row_stride))
            v2_0 = ZERO
            v2_1 = ZERO
            v2_2 = ZERO
            v2_3 = ZERO
            if q + 2 < 3 + n:
                rq = base + q + -1
                if base < 0:
                    rq = tables[U(rows + first_slot + q + -1)]
                v2_0, v2_1, v2_2, v2_3 = load_row4(x, U(xc_0 + rq * x_row_stride))
            if first:
                if q0 <= 0:
                    store_row4(state, U(st_0 + (0 - q0) * sc), u0_0, u0_1, u0_2, u0_3)
                if q0 <= 1:
                    store_row4(state, U(st_0 + (1 - q0) * sc), u1_0, u1_1, u1_2, u1_3)
                if q0 <= 2:
                    store_row4(state, U(st_0 + (2 - q0) * sc), u2_0, u2_1, u2_2, u2_3)
                first = False
            if q + 0 < 3 + n:
                store_row4(state, U(st_0 + (q + 0 - q0) * sc), v0_0, v0_1, v0_2, v0_3)
            if q + 1 < 3 + n:
                store_row4(state, U(st_0 + (q + 1 - q0) * sc), v1_0, v1_1, v1_2, v1_3)
            if q + 2 < 3 + n:
                store_row4(state, U(st_0 + (q + 2 - q0) * sc), v2_0, v2_1, v2_2, v2_3)
            q += 3

    if weight_stride_k == 1 and weight_stride_c == 4 and taps16_aligned(weight, U(weight_offset)):
        wq_0 = load_taps16(weight, U(weight_offset + c * 4))
        wq_1 = load_taps16(weight, U(weight_offset + (c + 1) * 4))
        wq_2 = load_taps16(weight, U(weight_offset + (c + 2) * 4))
        wq_3 = load_taps16(weight, U(weight_offset + (c + 3) * 4))
        w0_0 = load(tap16(wq_0, 0))
        w0_1 = load(tap16(wq_1, 0))
        w0_2 = load(tap16(wq_2, 0))
        w0_3 = load(tap16(wq_3, 0))
        w1_0 = load(tap16(wq_0, 1))
        w1_1 = load(tap16(wq_1, 1))
        w1_2 = load(tap16(wq_2, 1))
        w1_3 = load(tap16(wq_3, 1))
        w2_0 = load(tap16(wq_0, 2))
        w2_1 = load(tap16(wq_1, 2))
        w2_2 = load(tap16(wq_2, 2))
        w2_3 = load(tap16(wq_3, 2))
        w3_0 = load(tap16(wq_0, 3))
        w3_1 = load(tap16(wq_1, 3))
        w3_2 = load(tap16(wq_2, 3))
        w3_3 = load(tap16(wq_3, 3))
    else:
        w0_0 = load(strided(weight, U(weight_offset + c * weight_stride_c + 0 * weight_stride_k)))
        w0_1 = load(strided(weight, U(weight_offset + (c + 1) * weight_stride_c + 0 * weight_stride_k)))
        w0_2 = load(strided(weight, U(weight_offset + (c + 2) * weight_stride_c + 0 * weight_stride_k)))
        w0_3 = load(strided(weight, U(weight_offset + (c + 3) * weight_stride_c + 0 * weight_stride_k)))
        w1_0 = load(strided(weight, U(weight_offset + c * weight_stride_c + 1 * weight_stride_k)))
        w1_1 = load(strided(weight, U(weight_offset + (c + 1) * weight_stride_c + 1 * weight_stride_k)))
        w1_2 = load(strided(weight, U(weight_offset + (c + 2) * weight_stride_c + 1 * weight_stride_k)))
        w1_3 = load(strided(weight, U(weight_offset + (c + 3) * weight_stride_c + 1 * weight_stride_k)))
        w2_0 = load(strided(weight, U(weight_offset + c * weight_stride_c + 2 * weight_stride_k)))
        w2_1 = load(strided(weight, U(weight_offset + (c + 1) * weight_stride_c + 2 * weight_stride_k)))
        w2_2 = load(strided(weight, U(weight_offset + (c + 2) * weight_stride_c + 2 * weight_stride_k)))
        w2_3 = load(strided(weight, U(weight_offset + (c + 3) * weight_stride_c + 2 * weight_stride_k)))
        w3_0 = load(strided(weight, U(weight_offset + c * weight_stride_c + 3 * weight_stride_k)))
        w3_1 = load(strided(weight, U(weight_offset + (c + 1) * weight_stride_c + 3 * weight_stride_k)))
        w3_2 = load(strided(weight, U(weight_offset + (c + 2) * weight_stride_c + 3 * weight_stride_k)))
        w3_3 = load(strided(weight, U(weight_offset + (c + 3) * weight_stride_c + 3 * weight_stride_k)))
    bias_c_0 = F32_ZERO
    bias_c_1 = F32_ZERO
    bias_c_2 = F32_ZERO
    bias_c_3 = F32_ZERO
    if has_bias:
        if bias_stride == 1:
            if aligned_row4(bias, U(bias_offset)):
                rb_0, rb_1, rb_2, rb_3 = load_row4(bias, U(bias_offset + c + 0))
                bias_c_0 = load(rb_0)
                bias_c_1 = load(rb_1)
                bias_c_2 = load(rb_2)
                bias_c_3 = load(rb_3)
            else:
                bias_c_0 = load(element(bias, U(bias_offset + c)))
                bias_c_1 = load(element(bias, U(bias_offset + (c + 1))))
                bias_c_2 = load(element(bias, U(bias_offset + (c + 2))))
                bias_c_3 = load(element(bias, U(bias_offset + (c + 3))))
        else:
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
    if flags & FLAG_BLOCK_ROWS:
        for i in range(nb):
            r = r0 + i
            r_xf_0, r_xf_1, r_xf_2, r_xf_3 = load_row4(x, U(xc_0 + r * x_row_stride))
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
            store_row4(o, U(oc_0 + (r if ob < 0 else ob + i) * ors), store(acc_0), store(acc_1), store(acc_2), store(acc_3))
    else:
        for i in range(nb):
            r = tables[U(rows + t0 + i)]
            r_xf_0, r_xf_1, r_xf_2, r_xf_3 = load_row4(x, U(xc_0 + r * x_row_stride))
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
            store_row4(o, U(oc_0 + (r if ob < 0 else ob + i) * ors), store(acc_0), store(acc_1), store(acc_2), store(acc_3))
    if c < qk2 and ob >= lfrom:  # the same for the whole work-group
        group_barrier(item.get_group(), MemoryScope.WORK_GROUP)
        hc = ((c * head_k_magic) >> head_k_shift) * head_k  # its head's first channel
        ho = oc_0 - (c - hc)  # its offset in the part's rows
        for i in range((c - hc) // 4, nb, head_k // 4):
            at = ho + (ob + i) * ors
            ss = F32_ZERO
            for j in range(head_k):
                yv = load(o[U(at + j)])
                ss += yv * yv
            ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))
            for j in range(head_k):
                o[U(at + j)] = store(load(o[U(at + j)]) * ss)
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
