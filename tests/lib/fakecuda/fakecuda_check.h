/* Test-side queries of the emulated driver (fakecuda.h), resolved in the
 * copy this process loaded through GPUMEM_LIBCUDA. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fakecuda.h"

/* A symbol of the loaded emulator (asserts it is loaded and has it). */
void *gm_fake_symbol(const char *name);
/* This process's driver objects; false when the driver was never loaded. */
bool gm_fake_usage(fakecuda_usage_t *ret);
/* Bytes in use on physical device `device`, device-wide. */
uint64_t gm_fake_device_bytes(int device);
/* gm_test_fill()'s pattern written into device memory of the loaded emulator
 * by an emulated kernel, waited for (device memory is not CPU-accessible);
 * false, doing nothing, when p is not such memory. */
bool gm_fake_device_fill(void *p, size_t n, uint64_t seed);
/* gm_test_verify() of device memory of the loaded emulator, by an emulated
 * kernel: 1 or 0; -1 when p is not such memory. */
int gm_fake_device_verify(const void *p, size_t n, uint64_t seed);
/* Whether every byte of device memory of the loaded emulator at [p, +n) is
 * `value`, by an emulated kernel: 1 or 0; -1 when p is not such memory. */
int gm_fake_device_verify_byte(const void *p, size_t n, unsigned char value);
/* Asserts no emulated kernel faulted and this process holds no driver object (contexts, the calling
 * thread's context stack and page-locked host memory included) when the driver is loaded. */
void gm_fake_assert_no_objects(void);
/* Makes a fresh pool file for this test (FAKECUDA_POOL, inherited by the
 * processes it starts) into path (at least 64 bytes). */
void gm_fake_new_pool(char *path, size_t len);
/* Asserts that, within a few seconds, no process but this one holds memory on
 * the device (after a daemon stopped: its handles and its clients' mappings
 * must be gone). Reads the pool file itself, so this process need not have
 * loaded the driver (and stays free to fork clients that use it). Does
 * nothing without FAKECUDA_POOL. */
void gm_fake_assert_device_drained(void);
