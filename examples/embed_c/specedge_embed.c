/* Embedding specedge in a C program through CPython's C API: load a bundle once, stream a completion
 * through a C callback, and turn a Python exception into an error code and message.
 *
 *   cc specedge_embed.c $(python3-config --cflags --embed) $(python3-config --ldflags --embed) -o specedge_embed
 *   SPECEDGE_PYTHON=/path/to/venv/bin/python ./specedge_embed BUNDLE "def f(x):" [max_new_tokens]
 *
 * SPECEDGE_PYTHON names the interpreter of the environment that has specedge installed (a virtualenv's
 * bin/python): the embedded interpreter takes its site-packages from there. */
#include <Python.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SPECEDGE_OK = 0, SPECEDGE_ERROR = 1, SPECEDGE_INTERNAL = 2 };

typedef int (*specedge_piece_fn)(const char *piece, void *user);   /* nonzero return: stop early */

typedef struct {
    PyObject *decoder;              /* specedge.runtime.SpeculativeDecoder */
} specedge_t;

/* The pending Python exception as a message in `err`; SPECEDGE_ERROR for specedge's own errors (bad input,
 * named and with a fix), SPECEDGE_INTERNAL for anything else. Clears the exception. */
static int take_error(char *err, size_t errlen) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    int code = SPECEDGE_INTERNAL;
    PyObject *mod = PyImport_ImportModule("specedge.runtime.errors");
    PyObject *base = mod ? PyObject_GetAttrString(mod, "SpecedgeError") : NULL;
    if (base && type && PyErr_GivenExceptionMatches(type, base)) code = SPECEDGE_ERROR;
    PyErr_Clear();
    PyObject *text = value ? PyObject_Str(value) : NULL;
    const char *msg = text ? PyUnicode_AsUTF8(text) : NULL;
    const char *name = type ? ((PyTypeObject *)type)->tp_name : "error";
    snprintf(err, errlen, "%s: %s", name, msg ? msg : "(no message)");
    PyErr_Clear();
    Py_XDECREF(text); Py_XDECREF(base); Py_XDECREF(mod);
    Py_XDECREF(type); Py_XDECREF(value); Py_XDECREF(tb);
    return code;
}

int specedge_open(specedge_t *se, const char *bundle, char *err, size_t errlen) {
    se->decoder = NULL;
    PyObject *mod = PyImport_ImportModule("specedge.runtime");
    if (!mod) return take_error(err, errlen);
    PyObject *cls = PyObject_GetAttrString(mod, "SpeculativeDecoder");
    PyObject *load = cls ? PyObject_GetAttrString(cls, "from_bundle") : NULL;
    PyObject *args = Py_BuildValue("(s)", bundle);
    PyObject *kwargs = Py_BuildValue("{s:i}", "threads", 1);
    se->decoder = (load && args && kwargs) ? PyObject_Call(load, args, kwargs) : NULL;
    Py_XDECREF(kwargs); Py_XDECREF(args); Py_XDECREF(load); Py_XDECREF(cls); Py_DECREF(mod);
    return se->decoder ? SPECEDGE_OK : take_error(err, errlen);
}

int specedge_stream(specedge_t *se, const char *prompt, int max_new_tokens, specedge_piece_fn on_piece, void *user,
                    char *err, size_t errlen) {
    PyObject *method = PyObject_GetAttrString(se->decoder, "stream");
    PyObject *args = Py_BuildValue("(s)", prompt);
    PyObject *kwargs = Py_BuildValue("{s:i}", "max_new_tokens", max_new_tokens);
    PyObject *stream = (method && args && kwargs) ? PyObject_Call(method, args, kwargs) : NULL;
    Py_XDECREF(kwargs); Py_XDECREF(args); Py_XDECREF(method);
    if (!stream) return take_error(err, errlen);
    PyObject *it = PyObject_GetIter(stream);
    int code = SPECEDGE_OK, stopped = 0;
    PyObject *piece;
    while (it && !stopped && (piece = PyIter_Next(it))) {
        const char *text = PyUnicode_AsUTF8(piece);
        if (text) stopped = on_piece(text, user);
        Py_DECREF(piece);
        if (!text) break;
    }
    if (PyErr_Occurred()) code = take_error(err, errlen);
    PyObject *closed = PyObject_CallMethod(stream, "close", NULL);   /* frees the decoder for the next request */
    Py_XDECREF(closed);
    if (!closed && code == SPECEDGE_OK) code = take_error(err, errlen);
    Py_XDECREF(it); Py_DECREF(stream);
    return code;
}

void specedge_close(specedge_t *se) { Py_XDECREF(se->decoder); se->decoder = NULL; }

static int print_piece(const char *piece, void *user) {
    (void)user;
    fputs(piece, stdout);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s BUNDLE PROMPT [MAX_NEW_TOKENS]\n", argv[0]);
        return 2;
    }
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    const char *python = getenv("SPECEDGE_PYTHON");
    if (python) {                     /* that interpreter's environment (a virtualenv) supplies the packages */
        PyStatus status = PyConfig_SetBytesString(&config, &config.executable, python);
        if (PyStatus_Exception(status)) { fprintf(stderr, "error: bad SPECEDGE_PYTHON\n"); return 2; }
    }
    PyStatus status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status)) { fprintf(stderr, "error: cannot start Python\n"); return 2; }

    char err[1024] = "";
    specedge_t se;
    int code = specedge_open(&se, argv[1], err, sizeof err);
    if (code == SPECEDGE_OK) {
        code = specedge_stream(&se, argv[2], argc > 3 ? atoi(argv[3]) : 64, print_piece, NULL, err, sizeof err);
        specedge_close(&se);
    }
    if (code != SPECEDGE_OK) fprintf(stderr, "\nerror (%d): %s\n", code, err);
    if (Py_FinalizeEx() < 0 && code == SPECEDGE_OK) code = SPECEDGE_INTERNAL;
    return code;
}
