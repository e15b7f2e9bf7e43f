/* The first-touch page check of a row array in one call: the crc32c of many byte ranges of
 * one buffer (the mapped chunk files), each against its stored checksum, with the loop over
 * pages in C and the GIL released.  Optional: built at install when a C compiler is there
 * (pyproject.toml, ext-modules, optional), else embstore checks pages through
 * google-crc32c from Python (embstore/store/rows/pages.py chooses; both report the same
 * pages).
 *
 * crc32c here is the Castagnoli CRC as google-crc32c and Zarr's crc32c codec compute it
 * (initial value and final xor 0xFFFFFFFF), with the SSE 4.2 instruction, four ranges of
 * the same length hashed in lockstep (the instruction's latency is three cycles, its
 * throughput one a cycle: four independent streams keep it busy).  Without SSE 4.2 (or off
 * x86-64) ``HARDWARE`` is False and nothing is checked here.
 *
 * mismatched(raw, starts, stops, expected, out) -> n
 *   raw: a contiguous buffer; starts, stops: int64 buffers of m range bounds into it;
 *   expected: a uint32 buffer of m checksums; out: a writable int64 buffer of m entries.
 *   Writes the positions i (ascending) where crc32c(raw[starts[i]:stops[i]]) is not
 *   expected[i] into out[:n] and returns n.  A range outside raw raises ValueError
 *   before anything is read.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_SSE42_BUILD 1
#else
#define HAVE_SSE42_BUILD 0
#endif

#if HAVE_SSE42_BUILD
__attribute__((target("sse4.2"))) static uint32_t crc_one(const uint8_t *p, size_t n)
{
    uint64_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = _mm_crc32_u8(c32, *p++);
    return c32 ^ 0xFFFFFFFFu;
}

/* four ranges of n bytes each, hashed in lockstep */
__attribute__((target("sse4.2"))) static void crc_four(const uint8_t *p0, const uint8_t *p1,
                                                       const uint8_t *p2, const uint8_t *p3,
                                                       size_t n, uint32_t *out)
{
    uint64_t c0 = 0xFFFFFFFFu, c1 = 0xFFFFFFFFu, c2 = 0xFFFFFFFFu, c3 = 0xFFFFFFFFu;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w0, w1, w2, w3;
        memcpy(&w0, p0 + i, 8);
        memcpy(&w1, p1 + i, 8);
        memcpy(&w2, p2 + i, 8);
        memcpy(&w3, p3 + i, 8);
        c0 = _mm_crc32_u64(c0, w0);
        c1 = _mm_crc32_u64(c1, w1);
        c2 = _mm_crc32_u64(c2, w2);
        c3 = _mm_crc32_u64(c3, w3);
    }
    uint32_t d0 = (uint32_t)c0, d1 = (uint32_t)c1, d2 = (uint32_t)c2, d3 = (uint32_t)c3;
    for (; i < n; i++) {
        d0 = _mm_crc32_u8(d0, p0[i]);
        d1 = _mm_crc32_u8(d1, p1[i]);
        d2 = _mm_crc32_u8(d2, p2[i]);
        d3 = _mm_crc32_u8(d3, p3[i]);
    }
    out[0] = d0 ^ 0xFFFFFFFFu;
    out[1] = d1 ^ 0xFFFFFFFFu;
    out[2] = d2 ^ 0xFFFFFFFFu;
    out[3] = d3 ^ 0xFFFFFFFFu;
}

static Py_ssize_t check_all(const uint8_t *raw, const int64_t *starts, const int64_t *stops,
                            const uint32_t *expected, int64_t *out, Py_ssize_t m)
{
    Py_ssize_t n = 0, i = 0;
    uint32_t got[4];
    while (i < m) {
        size_t len = (size_t)(stops[i] - starts[i]);
        if (i + 4 <= m && (size_t)(stops[i + 1] - starts[i + 1]) == len
                && (size_t)(stops[i + 2] - starts[i + 2]) == len
                && (size_t)(stops[i + 3] - starts[i + 3]) == len) {
            crc_four(raw + starts[i], raw + starts[i + 1], raw + starts[i + 2],
                     raw + starts[i + 3], len, got);
            for (int j = 0; j < 4; j++)
                if (got[j] != expected[i + j])
                    out[n++] = i + j;
            i += 4;
        } else {
            if (crc_one(raw + starts[i], len) != expected[i])
                out[n++] = i;
            i += 1;
        }
    }
    return n;
}
#endif

static int hardware(void)
{
#if HAVE_SSE42_BUILD
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") ? 1 : 0;
#else
    return 0;
#endif
}

static int want(Py_buffer *b, Py_ssize_t m, Py_ssize_t item, const char *name)
{
    if (b->len != m * item) {
        PyErr_Format(PyExc_ValueError, "mismatched: %s holds %zd bytes, expected %zd (%zd "
                     "entries of %zd bytes)", name, b->len, m * item, m, item);
        return 0;
    }
    return 1;
}

static PyObject *mismatched(PyObject *self, PyObject *args)
{
    PyObject *o_raw, *o_starts, *o_stops, *o_exp, *o_out;
    Py_buffer raw, starts, stops, exp, out;
    Py_ssize_t n = 0;
    if (!PyArg_ParseTuple(args, "OOOOO", &o_raw, &o_starts, &o_stops, &o_exp, &o_out))
        return NULL;
    if (!hardware()) {
        PyErr_SetString(PyExc_RuntimeError, "mismatched: no SSE 4.2 crc32 instruction here");
        return NULL;
    }
    if (PyObject_GetBuffer(o_raw, &raw, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (PyObject_GetBuffer(o_starts, &starts, PyBUF_C_CONTIGUOUS) < 0)
        goto fail_raw;
    if (PyObject_GetBuffer(o_stops, &stops, PyBUF_C_CONTIGUOUS) < 0)
        goto fail_starts;
    if (PyObject_GetBuffer(o_exp, &exp, PyBUF_C_CONTIGUOUS) < 0)
        goto fail_stops;
    if (PyObject_GetBuffer(o_out, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        goto fail_exp;
    Py_ssize_t m = starts.len / 8;
    if (!want(&starts, m, 8, "starts") || !want(&stops, m, 8, "stops")
            || !want(&exp, m, 4, "expected") || !want(&out, m, 8, "out"))
        goto fail_out;
    const int64_t *a = (const int64_t *)starts.buf, *b = (const int64_t *)stops.buf;
    for (Py_ssize_t i = 0; i < m; i++) {
        if (a[i] < 0 || b[i] < a[i] || b[i] > raw.len) {
            PyErr_Format(PyExc_ValueError, "mismatched: range %zd (%lld..%lld) outside the "
                         "%zd bytes given", i, (long long)a[i], (long long)b[i], raw.len);
            goto fail_out;
        }
    }
#if HAVE_SSE42_BUILD
    Py_BEGIN_ALLOW_THREADS
    n = check_all((const uint8_t *)raw.buf, a, b, (const uint32_t *)exp.buf,
                  (int64_t *)out.buf, m);
    Py_END_ALLOW_THREADS
#endif
    PyBuffer_Release(&out);
    PyBuffer_Release(&exp);
    PyBuffer_Release(&stops);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&raw);
    return PyLong_FromSsize_t(n);
fail_out:
    PyBuffer_Release(&out);
fail_exp:
    PyBuffer_Release(&exp);
fail_stops:
    PyBuffer_Release(&stops);
fail_starts:
    PyBuffer_Release(&starts);
fail_raw:
    PyBuffer_Release(&raw);
    return NULL;
}

static PyMethodDef methods[] = {
    {"mismatched", mismatched, METH_VARARGS,
     "mismatched(raw, starts, stops, expected, out) -> n: positions whose crc32c differs"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pagecrc",
    "crc32c of many ranges of one buffer against their checksums, in one call", -1, methods,
};

PyMODINIT_FUNC PyInit__pagecrc(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObject(m, "HARDWARE", PyBool_FromLong(hardware())) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
