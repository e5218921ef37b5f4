/* The control connection behind a gpumem_admin (control.c): gpumemctl's kind
 * of session, holding no memory, one request at a time. admin.c sends its
 * requests on it. Not installed. */
#pragma once

#include <stdarg.h>

#include "gpumem/admin.h"
#include "msg.h"

/* Sends env on a's connection and waits for its reply, which must have body
 * `want` (GPUMEM__ENVELOPE__BODY__NOT_SET: any body but an Error). With
 * ret_fd, *ret_fd is the first fd the reply carried or -1, the caller's to
 * close. On failure returns negative errno and records its kind and text on a
 * (gpumem_admin_failure(), gpumem_admin_error()). */
int gm_control_call(gpumem_admin *a, Gpumem__Envelope *env, Gpumem__Envelope__BodyCase want,
                    Gpumem__Envelope **ret_reply, int *ret_fd);

/* Records a failure of `kind` with its text on a; returns err. */
int gm_control_fail(gpumem_admin *a, gpumem_admin_failure kind, int err, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));
int gm_control_vfail(gpumem_admin *a, gpumem_admin_failure kind, int err, const char *fmt, va_list ap)
        __attribute__((format(printf, 4, 0)));
