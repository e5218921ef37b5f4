# The cuda backend and mapper over the emulated driver (tests/fakecuda). Only
# when the build found cuda.h; otherwise there is no cuda code to test.
if(GPUMEM_HAVE_CUDA)
  # Test-only libcuda.so.1. Select it with GPUMEM_LIBCUDA=${GPUMEM_FAKECUDA};
  # nothing links against it.
  add_library(fakecuda SHARED ${CMAKE_CURRENT_SOURCE_DIR}/fakecuda/fakecuda.c)
  target_include_directories(fakecuda PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/fakecuda)
  target_include_directories(fakecuda PRIVATE ${CUDA_INCLUDE_DIR})
  set_target_properties(fakecuda PROPERTIES
    OUTPUT_NAME cuda
    SOVERSION 1
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/fakecuda)
  set(GPUMEM_FAKECUDA ${CMAKE_BINARY_DIR}/tests/fakecuda/libcuda.so.1)
  # Test-only libnvidia-ml.so.1 over the same pool: select it with
  # GPUMEM_LIBNVML=${GPUMEM_FAKENVML}.
  add_library(fakenvml SHARED ${CMAKE_CURRENT_SOURCE_DIR}/fakecuda/fakecuda.c)
  target_include_directories(fakenvml PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/fakecuda ${CUDA_INCLUDE_DIR})
  target_compile_definitions(fakenvml PRIVATE FAKE_NVML=1)
  set_target_properties(fakenvml PROPERTIES
    OUTPUT_NAME nvidia-ml
    SOVERSION 1
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/fakecuda)
  set(GPUMEM_FAKENVML ${CMAKE_BINARY_DIR}/tests/fakecuda/libnvidia-ml.so.1)

  # mapper_cuda.c is internal to libgpumem (hidden symbols), so the suite
  # compiles it in.
  add_library(gm_fakecuda_check STATIC ${CMAKE_CURRENT_SOURCE_DIR}/fakecuda/fakecuda_check.c)
  target_include_directories(gm_fakecuda_check PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/fakecuda)
  target_link_libraries(gm_fakecuda_check PUBLIC PkgConfig::CHECK ${CMAKE_DL_LIBS})

  add_executable(test_cuda_backend
    ${CMAKE_CURRENT_SOURCE_DIR}/test_cuda_backend.c
    ${CMAKE_SOURCE_DIR}/backend/cuda/mapper_cuda.c)
  target_include_directories(test_cuda_backend PRIVATE ${CMAKE_SOURCE_DIR}/backend ${CMAKE_CURRENT_SOURCE_DIR}/fakecuda
    ${CUDA_INCLUDE_DIR})
  target_link_libraries(test_cuda_backend PRIVATE gm_ipc gm_backend gm_testutil gm_fakecuda_check PkgConfig::CHECK)
  add_dependencies(test_cuda_backend fakecuda)
  add_test(NAME cuda_backend COMMAND test_cuda_backend)
  add_dependencies(test_cuda_backend fakenvml)
  set_tests_properties(cuda_backend PROPERTIES ENVIRONMENT
    "GPUMEM_LIBCUDA=${GPUMEM_FAKECUDA};GPUMEM_LIBNVML=${GPUMEM_FAKENVML};GM_TEST_FAKENVML=${GPUMEM_FAKENVML}")

  # End to end: a real daemon on the cuda backend, this process its client,
  # both on one emulated device pool.
  add_executable(test_cuda_e2e ${CMAKE_CURRENT_SOURCE_DIR}/test_cuda_e2e.c)
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
