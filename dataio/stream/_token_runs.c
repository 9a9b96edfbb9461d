/* dataio.stream._token_runs: a token batch's doc_ids and position_ids written in one pass from its
 * document runs (token_stream.py; without this extension it takes numpy's repeat and a subtraction).
 *
 * fill(run_at, run_doc, doc_ids, position_ids): buffers of int64, C-contiguous. Run i covers the flat
 * tokens [run_at[i], run_at[i + 1]) (the last one up to the end of doc_ids); each of its tokens t gets
 * doc_ids[t] = run_doc[i] and position_ids[t] = t - run_at[i]. run_at starts at 0 and never decreases.
 * The GIL is released while it writes (reader threads fill their chunks side by side).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static int check(Py_buffer *b, const char *name, int writable) {
    if (b->len % (Py_ssize_t)sizeof(int64_t) != 0 || (b->itemsize != (Py_ssize_t)sizeof(int64_t))) {
        PyErr_Format(PyExc_ValueError, "fill: %s must be an int64 buffer (itemsize %zd, %zd bytes)", name,
                     b->itemsize, b->len);
        return 0;
    }
    if (writable && b->readonly) {
        PyErr_Format(PyExc_ValueError, "fill: %s must be writable", name);
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

static PyMethodDef methods[] = {
    {"fill", runs_fill, METH_VARARGS,
     "fill(run_at, run_doc, doc_ids, position_ids): each run's tokens get its document and their offsets in it"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_token_runs",
                                    "doc_ids and position_ids of token batches in one pass", -1, methods};

PyMODINIT_FUNC PyInit__token_runs(void) { return PyModule_Create(&module); }
