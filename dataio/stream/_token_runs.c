/* dataio.stream._token_runs: the two passes of token batches (token_stream.py) that numpy makes in several,
 * each in one pass over the batch's memory; without this extension token_stream.py does them in numpy.
 *
 * copy_rows(src, dst, width, rows, starts, counts, pad_id): the input_ids rows copied from a piece's tokens,
 * widened to int64, padding after them, in one call for all of a piece's rows (numpy: a call per row).
 *
 * fill(run_at, run_doc, doc_ids, position_ids): buffers of int64, C-contiguous. Run i covers the flat
 * tokens [run_at[i], run_at[i + 1]) (the last one up to the end of doc_ids); each of its tokens t gets
 * doc_ids[t] = run_doc[i] and position_ids[t] = t - run_at[i]. run_at starts at 0 and never decreases.
 * The GIL is released while it writes (reader threads fill their chunks side by side).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static int check(Py_buffer *b, const char *name, int writable) {
    if (b->len % (Py_ssize_t)sizeof(int64_t) != 0 || (b->itemsize != (Py_ssize_t)sizeof(int64_t))) {
        PyErr_Format(PyExc_ValueError, "%s must be an int64 buffer (itemsize %zd, %zd bytes)", name,
                     b->itemsize, b->len);
        return 0;
    }
    if (writable && b->readonly) {
        PyErr_Format(PyExc_ValueError, "%s must be writable", name);
        return 0;
    }
    return 1;
}

static PyObject *runs_fill(PyObject *self, PyObject *args) {
    Py_buffer at, doc, docs, pos;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*w*w*", &at, &doc, &docs, &pos)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (!check(&at, "run_at", 0) || !check(&doc, "run_doc", 0) || !check(&docs, "doc_ids", 1) ||
        !check(&pos, "position_ids", 1)) {
        goto done;
    }
    const Py_ssize_t runs = at.len / 8, n = docs.len / 8;
    const int64_t *a = (const int64_t *)at.buf, *d = (const int64_t *)doc.buf;
    if (doc.len != at.len || pos.len != docs.len) {
        PyErr_SetString(PyExc_ValueError, "fill: run_at and run_doc, doc_ids and position_ids differ in length");
        goto done;
    }
    if (n > 0 && (runs == 0 || a[0] != 0)) {
        PyErr_SetString(PyExc_ValueError, "fill: the first run must start at token 0");
        goto done;
    }
    for (Py_ssize_t i = 1; i < runs; i++) {
        if (a[i] < a[i - 1] || a[i] > n) {
            PyErr_Format(PyExc_ValueError, "fill: run %zd starts at %lld, before its predecessor or past the end",
                         i, (long long)a[i]);
            goto done;
        }
    }
    int64_t *out_doc = (int64_t *)docs.buf, *out_pos = (int64_t *)pos.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < runs; i++) {
        const int64_t lo = a[i], hi = i + 1 < runs ? a[i + 1] : (int64_t)n, value = d[i];
        for (int64_t t = lo; t < hi; t++) {
            out_doc[t] = value;
            out_pos[t] = t - lo;
        }
    }
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&at);
    PyBuffer_Release(&doc);
    PyBuffer_Release(&docs);
    PyBuffer_Release(&pos);
    return result;
}


/* copy_rows(src, dst, width, rows, starts, counts, pad_id): row rows[i] of dst ((R, width) int64) gets the
 * counts[i] tokens of src (uint16 or uint32) from starts[i], widened, then pad_id to its end. */
static PyObject *runs_copy_rows(PyObject *self, PyObject *args) {
    PyObject *src_obj;
    Py_buffer src, dst, rows, starts, counts;
    Py_ssize_t width;
    long long pad_id;
    (void)self;
    if (!PyArg_ParseTuple(args, "Ow*ny*y*y*L", &src_obj, &dst, &width, &rows, &starts, &counts, &pad_id)) {
        return NULL;
    }
    PyObject *result = NULL;
    int have_src = PyObject_GetBuffer(src_obj, &src, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0;
    if (!have_src) {
        goto done;
    }
    if (!check(&dst, "dst", 1) || !check(&rows, "rows", 0) || !check(&starts, "starts", 0) ||
        !check(&counts, "counts", 0)) {
        goto done;
    }
    const int wide = src.itemsize == 4;
    const char *format = src.format != NULL ? src.format : "?";
    if (!((src.itemsize == 2 && strcmp(format, "H") == 0) || (src.itemsize == 4 && strcmp(format, "I") == 0))) {
        PyErr_Format(PyExc_ValueError, "copy_rows: src must hold uint16 or uint32 tokens (format %s)", format);
        goto done;
    }
    const Py_ssize_t m = rows.len / 8, num_rows = width > 0 ? dst.len / 8 / width : 0;
    const Py_ssize_t src_len = src.len / src.itemsize;
    if (width <= 0 || dst.len != num_rows * width * 8 || starts.len != rows.len || counts.len != rows.len) {
        PyErr_SetString(PyExc_ValueError, "copy_rows: dst is not (rows, width), or rows, starts and counts "
                        "differ in length");
        goto done;
    }
    const int64_t *r = (const int64_t *)rows.buf, *a = (const int64_t *)starts.buf, *n = (const int64_t *)counts.buf;
    for (Py_ssize_t i = 0; i < m; i++) {
        if (r[i] < 0 || r[i] >= num_rows || n[i] < 0 || n[i] > width || a[i] < 0 || a[i] + n[i] > src_len) {
            PyErr_Format(PyExc_ValueError, "copy_rows: row %lld (%lld tokens from %lld) is outside dst or src",
                         (long long)r[i], (long long)n[i], (long long)a[i]);
            goto done;
        }
    }
    int64_t *out = (int64_t *)dst.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < m; i++) {
        int64_t *row = out + r[i] * width;
        const int64_t count = n[i];
        if (wide) {
            const uint32_t *in = (const uint32_t *)src.buf + a[i];
            for (int64_t t = 0; t < count; t++) row[t] = in[t];
        } else {
            const uint16_t *in = (const uint16_t *)src.buf + a[i];
            for (int64_t t = 0; t < count; t++) row[t] = in[t];
        }
        for (int64_t t = count; t < width; t++) row[t] = pad_id;
    }
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    if (have_src) {
        PyBuffer_Release(&src);
    }
    PyBuffer_Release(&dst);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&counts);
    return result;
}

static PyMethodDef methods[] = {
    {"fill", runs_fill, METH_VARARGS,
     "fill(run_at, run_doc, doc_ids, position_ids): each run's tokens get its document and their offsets in it"},
    {"copy_rows", runs_copy_rows, METH_VARARGS,
     "copy_rows(src, dst, width, rows, starts, counts, pad_id): rows of tokens widened to int64, then padding"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_token_runs",
                                    "input_ids rows, doc_ids and position_ids of token batches, one pass each", -1, methods};

PyMODINIT_FUNC PyInit__token_runs(void) { return PyModule_Create(&module); }
