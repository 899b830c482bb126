
def jitconv_conv_w4_bfloat16_fast(item, x, x_offset, x_row_stride, out, out_offset, out_row_stride,
           weight, weight_offset, weight_stride_c, weight_stride_k,
           bias, bias_offset, bias_stride,
           state, state_offset, state_stride_line, state_stride_c, state_stride_col,
           tables, rows, blocks, links, has_bias, silu, out2, out2_offset, out2_row_stride,
           split, spec_slot0, win, win_offset, win_stride_row, win_stride_step,
           win_stride_c, win_stride_col):
    # rows, blocks: offsets of the per-call tables inside `tables` (jitconv.kernels.abi.TABLES);
    # a block's record holds BLOCK_FIELDS, its sequence's fields included.
    c = item.get_id(0) * 1  # first channel: the fastest index
    b = item.get_id(1)  # block
    blk = blocks + b * 8
    t0 = tables[U(blk)]
    nb = tables[U(blk + 1)]
    line = tables[U(blk + 4)]
    flags = tables[U(blk + 6)]
    r0 = tables[U(blk + 7)]  # the row of the block's first token (consecutive rows)
    xc = x_offset + c      # this channel in x and out
    oc = out_offset + c
    o = out  # the array this block's outputs go to, and its row stride
    ors = out_row_stride
    ob = -1  # out row r is x row r; split outputs: the block's first out row (its slot)
    if split:
        ob = t0
        if split == SPLIT_PARTS and flags & FLAG_SPEC:
            o = out2
            ors = out2_row_stride
            ob = t0 - spec_slot0
            oc = out2_offset + c
    if line < 0:
        # Padded sequence, or output rows no sequence covers: zeros, no state access.
        if ob >= 0 and flags & FLAG_UNCOVERED:
            return  # rows of neither part: no split output has them
        for i in range(nb):
            r = r0 + i
            if not flags & FLAG_BLOCK_ROWS:
                r = tables[U(rows + t0 + i)]
            o[U(oc + (r if ob < 0 else ob + i) * ors)] = ZERO
        return

    p0 = tables[U(blk + 2)]  # position of the block's first token in its sequence
    n = tables[U(blk + 3)]
    off = tables[U(blk + 5)]
    first_slot = t0 - p0  # the sequence's first token slot
    initial = flags & FLAG_INITIAL_STATE
    base = -1  # the row of position 0 when the sequence's rows are consecutive
    if flags & FLAG_SEQ_ROWS:
        base = r0 - p0
    if state_stride_c == 1:
        st = state_offset + line * state_stride_line + c  # line, channel
        sc = state_stride_col
        # u = concat(window, x_seq); u0..u2 hold u[p0 .. p0+S-1] as raw values.
        u0 = _window_value(x, xc, x_row_stride, state, st + (off + p0 + 0) * sc, tables, rows, first_slot, base, p0 - 3 + 0, initial, ZERO, element)
        u1 = _window_value(x, xc, x_row_stride, state, st + (off + p0 + 1) * sc, tables, rows, first_slot, base, p0 - 3 + 1, initial, ZERO, element)
        u2 = _window_value(x, xc, x_row_stride, state, st + (off + p0 + 2) * sc, tables, rows, first_slot, base, p0 - 3 + 2, initial, ZERO, element)
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
                v0 = ZERO
                if q + 0 < 3 + n:
                    rq = base + q + -3
                    if base < 0:
                        rq = tables[U(rows + first_slot + q + -3)]
                    v0 = x[U(xc + rq * x_row_stride)]
                v1 = ZERO
                if q + 1 < 3 + n:
                    rq = base + q + -2
                    if base < 0:
                        rq = tables[U(rows + first_slot + q + -2)]
                    v1 = x[U(xc + rq * x_row_stride)]
                v2 = ZERO
                if q + 2 < 3 + n:
                    rq = base + q + -1
                    if base < 0:
                        rq = tables[U(rows + first_slot + q + -1)]
                    v2 = x[U(xc + rq * x_row_stride)]
                if first:
                    if q0 <= 0:
                        state[U(st + (0 - q0) * sc)] = u0
                    if q0 <= 1:
                        state[U(st + (1 - q0) * sc)] = u1
                    if q0 <= 2:
                        state[U(st + (2 - q0) * sc)] = u2
                    first = False
                if q + 0 < 3 + n:
                    state[U(st + (q + 0 - q0) * sc)] = v0
                if q + 1 < 3 + n:
                    state[U(st + (q + 1 - q0) * sc)] = v1
                if q + 2 < 3 + n:
                    state[U(st + (q + 2 - q0) * sc)] = v2
                q += 3
    else:
        st = state_offset + line * state_stride_line + c * state_stride_c  # line, channel
        sc = state_stride_col
        # u = concat(window, x_seq); u0..u2 hold u[p0 .. p0+S-1] as raw values.
        u0 = _window_value(x, xc, x_row_stride, state, st + (off + p0 + 0) * sc, tables, rows, first_slot, base, p0 - 3 + 0, initial, ZERO, strided)
        u1 = _window_value(x, xc, x_row_stride, state, st + (off + p0 + 1) * sc, tables, rows, first_slot, base, p0 - 3 + 1, initial, ZERO, strided)
        u2 = _window_value(x, xc, x_row_stride, state, st + (off + p0 + 2) * sc, tables, rows, first_slot, base, p0 - 3 + 2, initial, ZERO, strided)
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
                v0 = ZERO
                if q + 0 < 3 + n:
                    rq = base + q + -3
                    if base < 0:
                        rq = tables[U(rows + first_slot + q + -3)]
                    v0 = x[U(xc + rq * x_row_stride)]
                v1 = ZERO
                if q + 1 < 3 + n:
                    rq = base + q + -2
                    if base < 0:
                        rq = tables[U(rows + first_slot + q + -2)]
                    v1 = x[U(xc + rq * x_row_stride)]
                v2 = ZERO
                if q + 2 < 3 + n:
                    rq = base + q + -1
                    if base < 0:
                        rq = tables[U(rows + first_slot + q + -1)]
                    v2 = x[U(xc + rq * x_row_stride)]
                if first:
                    if q0 <= 0:
                        state[U(st + (0 - q0) * sc)] = u0
                    if q0 <= 1:
                        state[U(st + (1 - q0) * sc)] = u1
                    if q0 <= 2:
                        state[U(st + (2 - q0) * sc)] = u2
                    first = False
                if q + 0 < 3 + n:
                    state[U(st + (q + 0 - q0) * sc)] = v0
                if q + 1 < 3 + n:
                    state[U(st + (q + 1 - q0) * sc)] = v1
                if q + 2 < 3 + n:
                    state[U(st + (q + 2 - q0) * sc)] = v2
                q += 3
    if weight_stride_k == 1 and weight_stride_c == 4 and taps16_aligned(weight, U(weight_offset)):
        wq = load_taps16(weight, U(weight_offset + c * 4))
        w0 = load(tap16(wq, 0))
        w1 = load(tap16(wq, 1))
        w2 = load(tap16(wq, 2))
        w3 = load(tap16(wq, 3))
    else:
        w0 = load(strided(weight, U(weight_offset + c * weight_stride_c + 0 * weight_stride_k)))
        w1 = load(strided(weight, U(weight_offset + c * weight_stride_c + 1 * weight_stride_k)))
        w2 = load(strided(weight, U(weight_offset + c * weight_stride_c + 2 * weight_stride_k)))
        w3 = load(strided(weight, U(weight_offset + c * weight_stride_c + 3 * weight_stride_k)))
    bias_c = F32_ZERO
    if has_bias:
        if bias_stride == 1:
            bias_c = load(element(bias, U(bias_offset + c)))
        else:
            bias_c = load(strided(bias, U(bias_offset + c * bias_stride)))
    f0 = load(u0)
    f1 = load(u1)
    f2 = load(u2)
    if flags & FLAG_BLOCK_ROWS:
        for i in range(nb):
            r = r0 + i
            xf = load(x[U(xc + r * x_row_stride)])
            acc = bias_c + w0 * f0 + w1 * f1 + w2 * f2 + w3 * xf
            f0 = f1
            f1 = f2
            f2 = xf
            if silu:
                acc = fdiv(acc, ONE + exp(-acc))
            o[U(oc + (r if ob < 0 else ob + i) * ors)] = store(acc)
    else:
        for i in range(nb):
            r = tables[U(rows + t0 + i)]
            xf = load(x[U(xc + r * x_row_stride)])
            acc = bias_c + w0 * f0 + w1 * f1 + w2 * f2 + w3 * xf
            f0 = f1
            f1 = f2
            f2 = xf
            if silu:
                acc = fdiv(acc, ONE + exp(-acc))
            o[U(oc + (r if ob < 0 else ob + i) * ors)] = store(acc)
