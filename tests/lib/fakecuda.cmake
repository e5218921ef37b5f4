# The emulated driver (tests/lib/fakecuda), only when the build found cuda.h;
# otherwise there is no cuda code to test.
if(GPUMEM_HAVE_CUDA)
  # Test-only libcuda.so.1. Select it with GPUMEM_LIBCUDA=${GPUMEM_FAKECUDA};
  # nothing links against it.
  add_library(fakecuda SHARED ${CMAKE_CURRENT_LIST_DIR}/fakecuda/fakecuda.c)
  target_include_directories(fakecuda PRIVATE ${CMAKE_CURRENT_LIST_DIR}/fakecuda)
  target_include_directories(fakecuda PRIVATE ${CUDA_INCLUDE_DIR})
  set_target_properties(fakecuda PROPERTIES
    OUTPUT_NAME cuda
    SOVERSION 1
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/fakecuda)
  set(GPUMEM_FAKECUDA ${CMAKE_BINARY_DIR}/tests/fakecuda/libcuda.so.1)
  # Test-only libnvidia-ml.so.1 over the same pool: select it with
  # GPUMEM_LIBNVML=${GPUMEM_FAKENVML}.
  add_library(fakenvml SHARED ${CMAKE_CURRENT_LIST_DIR}/fakecuda/fakecuda.c)
  target_include_directories(fakenvml PRIVATE ${CMAKE_CURRENT_LIST_DIR}/fakecuda ${CUDA_INCLUDE_DIR})
  target_compile_definitions(fakenvml PRIVATE FAKE_NVML=1)
  set_target_properties(fakenvml PROPERTIES
    OUTPUT_NAME nvidia-ml
    SOVERSION 1
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/fakecuda)
  set(GPUMEM_FAKENVML ${CMAKE_BINARY_DIR}/tests/fakecuda/libnvidia-ml.so.1)

  # The emulated device's checks (its pool drained), for the suites.
  add_library(gm_fakecuda_check STATIC ${CMAKE_CURRENT_LIST_DIR}/fakecuda/fakecuda_check.c)
  target_include_directories(gm_fakecuda_check PUBLIC ${CMAKE_CURRENT_LIST_DIR}/fakecuda)
  target_link_libraries(gm_fakecuda_check PUBLIC PkgConfig::CHECK ${CMAKE_DL_LIBS})
endif()
