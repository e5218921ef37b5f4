# The cuda backend end to end over the emulated driver (tests/lib/fakecuda).
# Only when the build found cuda.h.
if(GPUMEM_HAVE_CUDA)
  # End to end: a real daemon on the cuda backend, this process its client,
  # both on one emulated device pool.
  add_executable(test_cuda_e2e ${CMAKE_CURRENT_LIST_DIR}/test_cuda_e2e.c)
  target_link_libraries(test_cuda_e2e PRIVATE gm_testutil gm_fakecuda_check gpumem gm_backend gm_ipc PkgConfig::CHECK
    Threads::Threads)
  target_compile_definitions(test_cuda_e2e PRIVATE GPUMEMCTL_BIN="$<TARGET_FILE:gpumemctl>")
  add_dependencies(test_cuda_e2e fakecuda fakenvml gpumemd gpumemctl)
  add_test(NAME cuda_e2e COMMAND test_cuda_e2e)
  set_tests_properties(cuda_e2e PROPERTIES TIMEOUT 600 ENVIRONMENT
    "GPUMEM_TEST_BACKEND=cuda;GPUMEM_LIBCUDA=${GPUMEM_FAKECUDA};GPUMEM_LIBNVML=${GPUMEM_FAKENVML};FAKECUDA_CAPACITY=4G")
  # The same defects in central sessions (release requests and their batches,
  # the daemon's heap): connections without an explicit mode get a central one.
  add_test(NAME cuda_e2e_central COMMAND test_cuda_e2e)
  set_tests_properties(cuda_e2e_central PROPERTIES TIMEOUT 600 ENVIRONMENT
    "GPUMEM_TEST_BACKEND=cuda;GPUMEM_HEAP=central;GPUMEM_LIBCUDA=${GPUMEM_FAKECUDA};GPUMEM_LIBNVML=${GPUMEM_FAKENVML};FAKECUDA_CAPACITY=4G")

  # The client of scripts/gpu-check.sh (built here too, so the emulator run
  # of the check below tests it).
  add_executable(gpu_check_client ${CMAKE_SOURCE_DIR}/scripts/gpu-check/gpu_client.c)
  target_include_directories(gpu_check_client PRIVATE ${CUDA_INCLUDE_DIR})
  target_link_libraries(gpu_check_client PRIVATE gpumem ${CMAKE_DL_LIBS})
endif()

# scripts/gpu-check.sh end to end over the emulated driver and the stand-in
# nvidia-smi, on this build tree (about 10 s).
if(GPUMEM_HAVE_CUDA AND TARGET gpu_check_client)
  add_test(NAME gpu_check_emulator COMMAND ${CMAKE_SOURCE_DIR}/scripts/gpu-check.sh --emulator --build ${CMAKE_BINARY_DIR})
  set_tests_properties(gpu_check_emulator PROPERTIES TIMEOUT 120)
  add_dependencies(gpu_check_client gpumemd gpumemctl fakecuda fakenvml)
endif()

# Issues #23 and #25: release_check = verify | trust, and the continuous
# audit of believed give-backs, the attacker a process of another uid (this
# binary again, through setpriv) over the emulator and its NVML.
if(GPUMEM_HAVE_CUDA)
  add_executable(test_cuda_audit ${CMAKE_CURRENT_LIST_DIR}/test_cuda_audit.c)
  target_link_libraries(test_cuda_audit PRIVATE gm_testutil gm_fakecuda_check gpumem gm_backend gm_ipc PkgConfig::CHECK)
  target_compile_definitions(test_cuda_audit PRIVATE GPUMEMCTL_BIN="$<TARGET_FILE:gpumemctl>"
    AUDIT_BIN="$<TARGET_FILE:test_cuda_audit>")
  add_dependencies(test_cuda_audit fakecuda fakenvml gpumemd gpumemctl)
  add_test(NAME cuda_audit COMMAND test_cuda_audit)
  set_tests_properties(cuda_audit PROPERTIES TIMEOUT 300 ENVIRONMENT
    "GPUMEM_TEST_BACKEND=cuda;GPUMEM_LIBCUDA=${GPUMEM_FAKECUDA};GPUMEM_LIBNVML=${GPUMEM_FAKENVML};FAKECUDA_CAPACITY=4G")
endif()
