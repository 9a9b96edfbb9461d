/* A faster Huffman (entropy) decoder for baseline JPEGs, plugged into libjpeg-turbo's decoder.
 *
 * Why: on ImageNet-like JPEGs (~6 bits per pixel) entropy decoding is ~60% of a full decode, and a
 * region decode cannot skip it for any row above the window's bottom edge (no restart markers), so
 * it is the floor of the region decode (benchmarks/results_decode.md). libjpeg-turbo decodes one
 * Huffman code with an 8-bit lookahead and then reads the coefficient's extra bits in a second,
 * dependent step. Here one 10-bit lookup gives, for the common short codes, the code, its run and
 * the coefficient's value (its extra bits included: stb_image's "fast AC" idea), and the bit
 * buffer is refilled 4-7 bytes at a time where no 0xFF byte is near.
 *
 * How it plugs in: after jpeg_start_decompress (which has parsed the tables and reset the entropy
 * decoder; no entropy-coded byte has been read yet), fh_install replaces the public
 * cinfo->entropy->decode_mcu pointer; libjpeg's coefficient controller and jpeg_skip_scanlines
 * call it per MCU (with NULL to discard). It reads the entropy-coded bytes straight from the
 * jpeg_mem_src buffer. The coefficients are the same numbers libjpeg would decode, so the pixels
 * are bit for bit libjpeg's (tests/dataio/test_decode_region.py).
 *
 * Only where that is simple: sequential Huffman, 8-bit samples, one scan with every component,
 * every table present (restart intervals included); anything else keeps libjpeg's own decoder.
 * Corrupt data: running into a marker, an invalid code, a wrong restart marker raise libjpeg's
 * warnings (JWRN_HIT_MARKER, JWRN_HUFF_BAD_CODE, JWRN_MUST_RESYNC), which the strict error manager
 * turns into errors; data without an EOI marker is refused before any decoding (JWRN_JPEG_EOF),
 * whatever the window. Where both decode a damaged file the pixels are libjpeg's; which damaged
 * files each refuses can differ (libjpeg reads ahead differently, and only as far as a window needs).
 */
#ifndef DATAIO_FASTHUFF_H
#define DATAIO_FASTHUFF_H

#include <stdint.h>
#include <string.h>
#include <jerror.h>

/* The public head of libjpeg's entropy decoder (jpegint.h, unchanged since libjpeg 6b through
 * libjpeg-turbo 3): jpeglib.h leaves the type incomplete, and jpegint.h is not installed everywhere. */
typedef struct {
    void (*start_pass)(j_decompress_ptr cinfo);
    boolean (*decode_mcu)(j_decompress_ptr cinfo, JBLOCKROW *MCU_data);
    boolean insufficient_data;
} fh_entropy_head;

#define FH_BITS 12    /* lookahead bits of the AC tables (4 bytes an entry: 16 KiB each) */
#define FH_DC_BITS 10  /* of the DC tables (their codes are short): 2 KiB */
#define FH_EOB 64 /* a full entry's run at the end of block: k leaves 1..63 */
#define FH_PARTIAL 0x80 /* len flag: the entry decodes the code only; its extra bits follow */

typedef struct {
    int16_t value; /* the coefficient (extra bits decoded), when the entry is full */
    uint8_t run;   /* full AC entry: k's advance (the zero run; 15 for ZRL; FH_EOB); partial: the symbol */
    uint8_t len;   /* bits the entry consumes (code + extra bits); | FH_PARTIAL: the code only, its
                    * extra bits follow (FH_PARTIAL alone: a code longer than FH_BITS) */
} fh_entry;

typedef struct {
    fh_entry fast[1 << FH_BITS];
    int32_t maxcode[18]; /* largest code of each length (-1: none), [17] a sentinel */
    int32_t valoffset[17];
    uint8_t huffval[256];
    uint8_t key[17 + 256]; /* the JHUFF_TBL it was built from: reused while an image's table is the same */
    int built; /* its lookahead bits once built, else 0 */
    int is_ac;
} fh_table;

typedef struct {
    const uint8_t *p, *end; /* next entropy-coded byte; end of the data */
    uint64_t buf;           /* bit buffer, MSB first: its top `bits` bits are valid */
    int bits, pad;          /* pad: zero bits appended at a marker or the end of data (at the bottom) */
    int marker;             /* a marker (or the end) was met: no more data bytes */
    int restarts_to_go, next_restart; /* MCUs left in this restart interval; the next RSTn's n */
    j_decompress_ptr cinfo;
    int last_dc[MAX_COMPS_IN_SCAN];
    int blocks;
    const fh_table *dc[D_MAX_BLOCKS_IN_MCU], *ac[D_MAX_BLOCKS_IN_MCU];
    int comp[D_MAX_BLOCKS_IN_MCU];
    fh_table tables[2][NUM_HUFF_TBLS]; /* [0] DC, [1] AC */
} fh_state;

/* Zig-zag index -> natural order, with extra entries so a corrupt run past 63 stays in the block
 * (libjpeg's jpeg_natural_order does the same with 16) and an end of block (k + FH_EOB) stores its
 * zero at 63. */
static const uint8_t fh_natural[64 + 16 + FH_EOB] = {
    0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,  12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13,
    6,  7,  14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45, 38, 31,
    39, 46, 53, 60, 61, 54, 47, 55, 62, 63, [64 ... 64 + 16 + FH_EOB - 1] = 63};

#define FH_EXTEND(v, s) ((v) + ((((v) - (1 << ((s) - 1))) >> 31) & ((-1 << (s)) + 1)))

/* Build (or keep, when the image's table is the one built last) the decoding tables of htbl. */
static int fh_build(fh_table *t, const JHUFF_TBL *htbl, int nbits, int is_ac) {
    uint8_t key[17 + 256];
    memcpy(key, htbl->bits, 17);
    memcpy(key + 17, htbl->huffval, 256);
    if (t->built == nbits && t->is_ac == is_ac && memcmp(key, t->key, sizeof key) == 0) {
        return 0;
    }
    int size[257], code[257], n = 0;
    for (int l = 1; l <= 16; l++) {
        for (int i = 0; i < htbl->bits[l]; i++) {
            if (n >= 256) {
                return -1;
            }
            size[n++] = l;
        }
    }
    int c = 0, p = 0;
    for (int l = 1; l <= 16; l++) {
        while (p < n && size[p] == l) {
            code[p++] = c++;
        }
        if (c > (1 << l)) {
            return -1; /* not a valid prefix code */
        }
        c <<= 1;
    }
    p = 0;
    for (int l = 1; l <= 16; l++) {
        if (htbl->bits[l]) {
            t->valoffset[l] = p - code[p];
            p += htbl->bits[l];
            t->maxcode[l] = code[p - 1];
        } else {
            t->maxcode[l] = -1;
        }
    }
    t->maxcode[17] = 0x7fffffff;
    memcpy(t->huffval, htbl->huffval, 256);
    for (int i = 0; i < (1 << nbits); i++) {
        t->fast[i].len = FH_PARTIAL, t->fast[i].run = 0, t->fast[i].value = 0;
    }
    for (p = 0; p < n; p++) {
        int l = size[p];
        if (l > nbits) {
            continue;
        }
        int rs = htbl->huffval[p], s = rs & 15, fill = nbits - l;
        for (int j = 0; j < (1 << fill); j++) {
            fh_entry *e = &t->fast[(code[p] << fill) | j];
            if (s == 0) { /* DC: a zero difference; AC: end of block, or ZRL (0xF0: sixteen zeros) */
                e->len = (uint8_t)l, e->value = 0, e->run = (uint8_t)(!is_ac ? 0 : rs == 0xF0 ? 15 : FH_EOB);
            } else if (l + s <= nbits) {
                int v = (j >> (fill - s)) & ((1 << s) - 1);
                e->len = (uint8_t)(l + s), e->value = (int16_t)FH_EXTEND(v, s), e->run = (uint8_t)(is_ac ? rs >> 4 : 0);
            } else {
                e->len = (uint8_t)(l | FH_PARTIAL), e->value = 0, e->run = (uint8_t)rs;
            }
        }
    }
    memcpy(t->key, key, sizeof key);
    t->built = nbits;
    t->is_ac = is_ac;
    return 0;
}

static void fh_refill_slow(fh_state *st) {
    while (st->bits <= 56 && !st->marker) {
        if (st->p >= st->end) { /* no marker: the data was cut; libjpeg's memory source warns here too */
            WARNMS(st->cinfo, JWRN_JPEG_EOF);
            st->marker = 1;
            break;
        }
        unsigned b = *st->p;
        if (b == 0xFF) { /* 0xFF 0x00 is a data 0xFF (fill 0xFFs may come first); else a marker */
            const uint8_t *q = st->p + 1;
            while (q < st->end && *q == 0xFF) {
                q++;
            }
            if (q >= st->end || *q != 0x00) {
                st->marker = 1;
                break;
            }
            st->p = q + 1;
        } else {
            st->p++;
        }
        st->buf |= (uint64_t)b << (56 - st->bits);
        st->bits += 8;
    }
    while (st->bits <= 56) { /* past a marker: zeros, like libjpeg; using them is an error */
        st->bits += 8;
        st->pad += 8;
    }
}

/* At least 57 valid (or padded) bits in the bit buffer (*buf, *bits: the caller's registers, st's
 * copy is stale until the caller writes them back). */
static inline void fh_refill(fh_state *st, uint64_t *buf, int *bits) {
    if (__builtin_expect(st->end - st->p >= 8 && !st->marker, 1)) {
        uint64_t w;
        memcpy(&w, st->p, 8);
        w = __builtin_bswap64(w);
        uint64_t x = ~w; /* a zero byte in ~w is a 0xFF byte in w */
        if (__builtin_expect(!((x - 0x0101010101010101ULL) & ~x & 0x8080808080808080ULL), 1)) {
            int nbytes = (64 - *bits) >> 3;
            *buf |= (w >> (64 - 8 * nbytes)) << (64 - *bits - 8 * nbytes);
            *bits += 8 * nbytes;
            st->p += nbytes;
            return;
        }
    }
    st->buf = *buf, st->bits = *bits;
    fh_refill_slow(st);
    *buf = st->buf, *bits = st->bits;
}

/* A code longer than the table's lookahead, at the top of buf (at least 32 valid bits): its length
 * << 8 | its symbol. The buffer goes by value so that the caller's stays in registers. */
static int fh_slow_symbol(j_decompress_ptr cinfo, const fh_table *t, uint64_t buf) {
    int l = t->built + 1;
    int32_t code = (int32_t)(buf >> (64 - l));
    while (code > t->maxcode[l]) {
        if (++l > 16) {
            WARNMS(cinfo, JWRN_HUFF_BAD_CODE); /* the strict error manager does not return */
            return 16 << 8;
        }
        code = (int32_t)(buf >> (64 - l));
    }
    return l << 8 | t->huffval[(t->valoffset[l] + code) & 0xFF];
}

/* The extra bits of a size-s coefficient (s >= 1), sign-extended. */
static inline int fh_extra(uint64_t *buf, int *bits, int s) {
    int v = (int)(*buf >> (64 - s));
    *buf <<= s, *bits -= s;
    return FH_EXTEND(v, s);
}

/* One block's coefficients (zig-zag order 0..63) into blk (natural order), or discarded if NULL.
 * A full AC entry's `run` is what k advances by before the store: the zero run for a coefficient,
 * 15 for sixteen zeros (a zero stored), FH_EOB for the end of block (a zero stored at 63, which is
 * still zero: the loop ends there). The bit buffer lives in locals (registers) meanwhile. */
static inline void fh_block(j_decompress_ptr cinfo, fh_state *st, const fh_table *dc, const fh_table *ac,
                            int *last_dc, JCOEF *blk) {
    uint64_t buf = st->buf;
    int bits = st->bits, v;
    if (bits < 32) {
        fh_refill(st, &buf, &bits);
    }
    fh_entry e = dc->fast[buf >> (64 - FH_DC_BITS)];
    if (__builtin_expect(e.len < FH_PARTIAL, 1)) {
        buf <<= e.len, bits -= e.len;
        v = e.value;
    } else {
        int s;
        if (e.len != FH_PARTIAL) {
            buf <<= e.len & 0x7f, bits -= e.len & 0x7f;
            s = e.run & 15;
        } else {
            int got = fh_slow_symbol(cinfo, dc, buf);
            buf <<= got >> 8, bits -= got >> 8;
            s = got & 15;
        }
        v = s ? fh_extra(&buf, &bits, s) : 0;
    }
    if (__builtin_add_overflow(*last_dc, v, last_dc)) { /* as libjpeg-turbo: corrupt data, not undefined C */
        ERREXIT(cinfo, JERR_BAD_DCT_COEF);
    }
    if (blk) {
        blk[0] = (JCOEF)*last_dc;
    }
    for (int k = 1; k < 64; k++) {
        if (bits < 32) {
            fh_refill(st, &buf, &bits);
        }
        e = ac->fast[buf >> (64 - FH_BITS)];
        if (__builtin_expect(e.len < FH_PARTIAL, 1)) {
            buf <<= e.len, bits -= e.len;
            k += e.run;
            v = e.value;
        } else {
            int rs;
            if (e.len != FH_PARTIAL) {
                buf <<= e.len & 0x7f, bits -= e.len & 0x7f;
                rs = e.run;
            } else {
                int got = fh_slow_symbol(cinfo, ac, buf);
                buf <<= got >> 8, bits -= got >> 8;
                rs = got & 0xFF;
            }
            int s = rs & 15;
            k += s ? rs >> 4 : (rs == 0xF0 ? 15 : FH_EOB);
            v = s ? fh_extra(&buf, &bits, s) : 0;
        }
        if (blk) {
            blk[fh_natural[k]] = (JCOEF)v;
        }
    }
    st->buf = buf, st->bits = bits;
}

/* At a restart interval's end: the next bytes must be the expected RSTn marker (only fill 0xFFs
 * before it, fewer than 8 bits left unused); then a fresh bit buffer and DC predictions. Anything
 * else is libjpeg's JWRN_MUST_RESYNC, which the strict error manager turns into an error. */
static void fh_restart(j_decompress_ptr cinfo, fh_state *st) {
    const uint8_t *q = st->p;
    while (q < st->end && *q == 0xFF) {
        q++;
    }
    int found = q < st->end ? *q : -1;
    if (q == st->p || found != 0xD0 + st->next_restart || st->bits - st->pad >= 8) {
        WARNMS2(cinfo, JWRN_MUST_RESYNC, found, st->next_restart);
    }
    st->p = q < st->end ? q + 1 : st->end;
    st->buf = 0, st->bits = 0, st->pad = 0, st->marker = 0;
    memset(st->last_dc, 0, sizeof st->last_dc);
    st->next_restart = (st->next_restart + 1) & 7;
    st->restarts_to_go = (int)cinfo->restart_interval;
}

static boolean fh_decode_mcu(j_decompress_ptr cinfo, JBLOCKROW *MCU_data) {
    fh_state *st = (fh_state *)cinfo->client_data;
    if (cinfo->restart_interval) {
        if (st->restarts_to_go == 0) {
            fh_restart(cinfo, st);
        }
        st->restarts_to_go--;
    }
    for (int b = 0; b < st->blocks; b++) {
        fh_block(cinfo, st, st->dc[b], st->ac[b], &st->last_dc[st->comp[b]], MCU_data ? MCU_data[b][0] : NULL);
    }
    if (st->pad > st->bits) { /* zeros past a marker were decoded: the data ran out */
        WARNMS(cinfo, JWRN_HIT_MARKER);
    }
    /* libjpeg's source where its own decoder would leave it (never past a marker: the refills stop
     * before any 0xFF that is not stuffing), should it read markers after the scan. */
    cinfo->src->next_input_byte = st->p;
    cinfo->src->bytes_in_buffer = (size_t)(st->end - st->p);
    return TRUE;
}

/* Whether an EOI marker follows p (searched from the end: the last bytes, unless a trailer follows). */
static int fh_has_eoi(const uint8_t *p, const uint8_t *end) {
    for (const uint8_t *q = end - 2; q >= p; q--) {
        if (q[0] == 0xFF && q[1] == 0xD9) {
            return 1;
        }
    }
    return 0;
}

/* Take over the entropy decoding of a decompressor started on a jpeg_mem_src buffer; 1 if it did,
 * 0 where libjpeg's decoder stays (see the conditions at the top). */
static int fh_install(j_decompress_ptr cinfo, fh_state *st) {
    if (cinfo->progressive_mode || cinfo->arith_code || cinfo->data_precision != 8 ||
        cinfo->Ss != 0 || cinfo->Se != 63 || cinfo->Ah != 0 || cinfo->Al != 0 ||
        cinfo->comps_in_scan != cinfo->num_components || cinfo->blocks_in_MCU > D_MAX_BLOCKS_IN_MCU ||
        cinfo->comps_in_scan > MAX_COMPS_IN_SCAN || cinfo->entropy == NULL || cinfo->src == NULL) {
        return 0;
    }
    for (int ci = 0; ci < cinfo->comps_in_scan; ci++) {
        const jpeg_component_info *comp = cinfo->cur_comp_info[ci];
        const JHUFF_TBL *dc = cinfo->dc_huff_tbl_ptrs[comp->dc_tbl_no], *ac = cinfo->ac_huff_tbl_ptrs[comp->ac_tbl_no];
        if (dc == NULL || ac == NULL || fh_build(&st->tables[0][comp->dc_tbl_no], dc, FH_DC_BITS, 0) != 0 ||
            fh_build(&st->tables[1][comp->ac_tbl_no], ac, FH_BITS, 1) != 0) {
            return 0;
        }
        st->last_dc[ci] = 0;
    }
    st->blocks = cinfo->blocks_in_MCU;
    for (int b = 0; b < st->blocks; b++) {
        const jpeg_component_info *comp = cinfo->cur_comp_info[cinfo->MCU_membership[b]];
        st->comp[b] = cinfo->MCU_membership[b];
        st->dc[b] = &st->tables[0][comp->dc_tbl_no];
        st->ac[b] = &st->tables[1][comp->ac_tbl_no];
    }
    st->p = cinfo->src->next_input_byte;
    st->end = st->p + cinfo->src->bytes_in_buffer;
    if (!fh_has_eoi(st->p, st->end)) {
        /* Cut short: refused whatever the window (libjpeg reads only as far as the window needs, so
         * whether it noticed depended on the crop); the strict error manager does not return. */
        WARNMS(cinfo, JWRN_JPEG_EOF);
        return 0;
    }
    st->buf = 0, st->bits = 0, st->pad = 0, st->marker = 0;
    st->restarts_to_go = (int)cinfo->restart_interval, st->next_restart = 0;
    st->cinfo = cinfo;
    cinfo->client_data = st;
    ((fh_entropy_head *)(void *)cinfo->entropy)->decode_mcu = fh_decode_mcu;
    return 1;
}

#endif
