/* Region decode of a JPEG through libjpeg-turbo's libjpeg API: only the iMCU-aligned region that
 * covers a crop window is decoded (jpeg_crop_scanline for the columns, jpeg_skip_scanlines for the
 * rows above, stop after the window's last row), optionally at a DCT scale 1/denom.
 *
 *   decode(data, denom, x0, y0, x1, y1) -> bytearray of (y1 - y0) * (x1 - x0) * 3 RGB bytes
 *
 *   to_planes(src, dst, height, width, flip): (H, W, 3) RGB -> (3, H, W) planes, mirrored if flip
 *
 * The entropy decoding of baseline JPEGs goes through _fasthuff.h (~22% less time than libjpeg's own,
 * the same coefficients); set_fast_huffman(False) keeps libjpeg's, for comparison.
 *
 * The window [x0, x1) x [y0, y1) is in pixels of the image scaled by 1/denom (libjpeg rounds the
 * scaled size up). Any libjpeg warning (corrupt or truncated data) is an error, like simplejpeg's
 * strict mode, so the caller can fall back to its usual decoder and its usual error. The GIL is
 * released while libjpeg works; the input buffer is held through Py_buffer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>
#include <pthread.h>

#include "_fasthuff.h"

#if !defined(LIBJPEG_TURBO_VERSION_NUMBER) || LIBJPEG_TURBO_VERSION_NUMBER < 1005000
#error "libjpeg-turbo >= 1.5 is needed (jpeg_crop_scanline, jpeg_skip_scanlines)"
#endif

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
} strict_error_mgr;

static void on_error(j_common_ptr cinfo) {
    strict_error_mgr *err = (strict_error_mgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0) { /* a warning: corrupt data that libjpeg would paper over */
        on_error(cinfo);
    }
}

/* The fast Huffman decoder's state (~36 KB with its tables), one per thread: decodes run in parallel
 * with the GIL released, and a thread's tables are reused while the images' tables are the same. */
static pthread_key_t fh_key;
static int fh_enabled = 1, fh_key_ok = 0;
static long fh_decodes = 0; /* decodes that took the fast entropy decoder (atomic), for tests */

static fh_state *fh_thread_state(void) {
    if (!fh_key_ok) {
        return NULL;
    }
    fh_state *st = (fh_state *)pthread_getspecific(fh_key);
    if (st == NULL && (st = (fh_state *)calloc(1, sizeof *st)) != NULL && pthread_setspecific(fh_key, st) != 0) {
        free(st);
        st = NULL;
    }
    return st;
}

typedef struct {
    int denom, x0, y0, x1, y1;
    unsigned char *out;
    JSAMPLE *row;
    int expect_w, expect_h; /* scaled size the caller computed; 0 = do not check */
} region_job;

/* Decode job->window into job->out; returns 0, or -1 with err->message set. GIL released. */
static int run_region(struct jpeg_decompress_struct *cinfo, strict_error_mgr *err, region_job *job,
                      const unsigned char *data, size_t size) {
    if (setjmp(err->jump)) {
        return -1;
    }
    jpeg_mem_src(cinfo, data, (unsigned long)size);
    jpeg_read_header(cinfo, TRUE);
    cinfo->out_color_space = JCS_RGB; /* from YCbCr, RGB or grayscale; CMYK/YCCK raise here */
    cinfo->scale_num = 1;
    cinfo->scale_denom = (unsigned int)job->denom;
    jpeg_start_decompress(cinfo);
    if ((int)cinfo->output_width < job->x1 || (int)cinfo->output_height < job->y1 ||
        (job->expect_w && ((int)cinfo->output_width != job->expect_w ||
                           (int)cinfo->output_height != job->expect_h))) {
        snprintf(err->message, sizeof err->message, "window %d,%d-%d,%d does not fit the %ux%u image at 1/%d",
                 job->x0, job->y0, job->x1, job->y1, cinfo->output_width, cinfo->output_height, job->denom);
        return -1;
    }
    /* One column more on each side: libjpeg's fancy upsampling replicates the region's first and
     * last column instead of reading its neighbour, so those two columns may differ from a full
     * decode; with the margin they fall outside the window (at the image's own edges they agree). */
    int left = job->x0 > 0 ? job->x0 - 1 : 0;
    int right = job->x1 < (int)cinfo->output_width ? job->x1 + 1 : job->x1;
    JDIMENSION xoff = (JDIMENSION)left, width = (JDIMENSION)(right - left);
    jpeg_crop_scanline(cinfo, &xoff, &width); /* widens to iMCU columns: xoff <= left, end >= right */
    fh_state *fast = fh_enabled ? fh_thread_state() : NULL;
    if (fast != NULL) {
        if (fh_install(cinfo, fast)) { /* where it applies; else libjpeg's own entropy decoder */
            __atomic_add_fetch(&fh_decodes, 1, __ATOMIC_RELAXED);
        }
    }
    job->row = (JSAMPLE *)malloc((size_t)width * 3);
    if (job->row == NULL) {
        snprintf(err->message, sizeof err->message, "out of memory");
        return -1;
    }
    if (job->y0 > 0) {
        jpeg_skip_scanlines(cinfo, (JDIMENSION)job->y0);
    }
    size_t out_row = (size_t)(job->x1 - job->x0) * 3, skip = (size_t)(job->x0 - (int)xoff) * 3;
    for (int y = job->y0; y < job->y1; y++) {
        JSAMPROW rows[1] = {job->row};
        if (jpeg_read_scanlines(cinfo, rows, 1) != 1) {
            snprintf(err->message, sizeof err->message, "no scanline %d", y);
            return -1;
        }
        memcpy(job->out + (size_t)(y - job->y0) * out_row, job->row + skip, out_row);
    }
    return 0;
}

static PyObject *region_decode(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buf;
    region_job job = {0};
    if (!PyArg_ParseTuple(args, "y*iiiii|ii", &buf, &job.denom, &job.x0, &job.y0, &job.x1, &job.y1,
                          &job.expect_w, &job.expect_h)) {
        return NULL;
    }
    if (!(job.denom == 1 || job.denom == 2 || job.denom == 4 || job.denom == 8) || job.x0 < 0 ||
        job.y0 < 0 || job.x1 <= job.x0 || job.y1 <= job.y0) {
        PyBuffer_Release(&buf);
        PyErr_Format(PyExc_ValueError, "bad window %d,%d-%d,%d or denom %d", job.x0, job.y0, job.x1,
                     job.y1, job.denom);
        return NULL;
    }
    PyObject *out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(job.x1 - job.x0) * (job.y1 - job.y0) * 3);
    if (out == NULL) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    job.out = (unsigned char *)PyByteArray_AS_STRING(out);
    struct jpeg_decompress_struct cinfo;
    strict_error_mgr err;
    int status;
    Py_BEGIN_ALLOW_THREADS
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    err.message[0] = '\0';
    jpeg_create_decompress(&cinfo);
    status = run_region(&cinfo, &err, &job, (const unsigned char *)buf.buf, (size_t)buf.len);
    jpeg_destroy_decompress(&cinfo); /* also aborts a decode stopped after the window's last row */
    free(job.row);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    if (status != 0) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_ValueError, err.message);
        return NULL;
    }
    return out;
}

/* GCC vectorizes the stride-3 loads below with AVX2 shuffles (~5x the scalar loop); target_clones picks
 * that version at load time where the CPU has AVX2, so the build stays portable. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__) /* ifunc */
#define FAST_LOOP __attribute__((optimize("O3"), target_clones("avx2", "default")))
#else
#define FAST_LOOP
#endif

/* (H, W, 3) interleaved RGB -> (3, H, W) planes, mirrored left-right when flip: the layout change
 * (and flip) after the resize: ~5 us at 224 x 224, where torch's or numpy's strided copy takes 35-45 us. */
FAST_LOOP static void planes_from_rgb(const unsigned char *src, unsigned char *dst, size_t height, size_t width, int flip) {
    size_t plane = height * width;
    unsigned char *r = dst, *g = dst + plane, *b = dst + 2 * plane;
    for (size_t y = 0; y < height; y++) {
        const unsigned char *s = src + y * width * 3;
        size_t row = y * width;
        if (flip) {
            for (size_t x = 0, d = row + width - 1; x < width; x++, d--) {
                r[d] = s[3 * x], g[d] = s[3 * x + 1], b[d] = s[3 * x + 2];
            }
        } else {
            for (size_t x = 0; x < width; x++) {
                r[row + x] = s[3 * x], g[row + x] = s[3 * x + 1], b[row + x] = s[3 * x + 2];
            }
        }
    }
}

static PyObject *region_to_planes(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer src, dst;
    Py_ssize_t height, width;
    int flip;
    if (!PyArg_ParseTuple(args, "y*w*nnp", &src, &dst, &height, &width, &flip)) {
        return NULL;
    }
    if (height < 0 || width < 0 || src.len != height * width * 3 || dst.len != src.len) {
        PyErr_Format(PyExc_ValueError, "to_planes: %zd and %zd bytes for %zd x %zd x 3", src.len, dst.len, height, width);
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    planes_from_rgb((const unsigned char *)src.buf, (unsigned char *)dst.buf, (size_t)height, (size_t)width, flip);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    Py_RETURN_NONE;
}

static PyObject *region_set_fast_huffman(PyObject *self, PyObject *args) {
    (void)self;
    int flag;
    if (!PyArg_ParseTuple(args, "p", &flag)) {
        return NULL;
    }
    int before = fh_enabled && fh_key_ok;
    fh_enabled = flag;
    return PyBool_FromLong(before);
}

static PyObject *region_fast_huffman_decodes(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    return PyLong_FromLong(__atomic_load_n(&fh_decodes, __ATOMIC_RELAXED));
}

static PyMethodDef methods[] = {
    {"decode", region_decode, METH_VARARGS,
     "decode(data, denom, x0, y0, x1, y1[, scaled_w, scaled_h]) -> bytearray: the window's RGB rows"},
    {"to_planes", region_to_planes, METH_VARARGS,
     "to_planes(src, dst, height, width, flip): (H, W, 3) RGB bytes -> (3, H, W) planes in dst, mirrored if flip"},
    {"set_fast_huffman", region_set_fast_huffman, METH_VARARGS,
     "set_fast_huffman(flag) -> bool: use the fast entropy decoder (default True; False: libjpeg's own), "
     "returning whether it was used before (benchmarks and parity tests compare the two)"},
    {"fast_huffman_decodes", region_fast_huffman_decodes, METH_NOARGS,
     "fast_huffman_decodes() -> int: decodes in this process that took the fast entropy decoder"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_region",
                                    "JPEG region decode over libjpeg-turbo", -1, methods};

PyMODINIT_FUNC PyInit__region(void) {
    fh_key_ok = pthread_key_create(&fh_key, free) == 0;
    PyObject *mod = PyModule_Create(&module);
    if (mod != NULL) {
        PyModule_AddIntConstant(mod, "LIBJPEG_TURBO_VERSION", LIBJPEG_TURBO_VERSION_NUMBER);
    }
    return mod;
}
