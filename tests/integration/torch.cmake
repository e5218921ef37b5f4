# PyTorch integration: libgpumem_torch's entry points from a C harness (threads,
# two daemons, refusals, fork, restarts), and the gpumem Python package under
# Debian's python3 and pytest against real daemons (tests/integration/python).
add_executable(test_torch_alloc ${CMAKE_CURRENT_LIST_DIR}/test_torch_alloc.c)
target_link_libraries(test_torch_alloc PRIVATE gm_testutil gpumem_torch gpumem PkgConfig::CHECK Threads::Threads)
target_compile_definitions(test_torch_alloc PRIVATE GPUMEMCTL_BIN="$<TARGET_FILE:gpumemctl>")
add_dependencies(test_torch_alloc gpumemd gpumemctl)
add_test(NAME torch_entry_points_host COMMAND test_torch_alloc)
set_tests_properties(torch_entry_points_host PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host" TIMEOUT 600)

# Debian's interpreter: the package must run on it with nothing from pip.
find_program(GM_TEST_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
# The whole suite twice: central sessions (the heap in the daemon) and local
# ones (the heap in the process).
if(GM_TEST_PYTHON3)
  set(GM_PY_ENV "PYTHONPATH=${PROJECT_SOURCE_DIR}/python;GPUMEM_LIBRARY_DIR=$<TARGET_FILE_DIR:gpumem>;GPUMEMD_BIN=$<TARGET_FILE:gpumemd>;GPUMEMCTL_BIN=$<TARGET_FILE:gpumemctl>;GM_SNAPSHOT_CHECK=${GM_SNAPSHOT_CHECK};GM_TORCH_TRAIN=${PROJECT_SOURCE_DIR}/scripts/gpu-check/torch_train.py;PYTHONDONTWRITEBYTECODE=1")
  add_test(NAME python_gpumem
    COMMAND ${GM_TEST_PYTHON3} -m pytest -q -p no:cacheprovider ${CMAKE_CURRENT_LIST_DIR}/python)
  # Python is not built with the sanitizers: integration.cmake's runtimes are
  # preloaded (empty outside ASan builds).
  string(REPLACE " " ";" GM_PYTHON_TEST_ENV "${GM_PYTHON_SANITIZER_ENV}")
  set_tests_properties(python_gpumem PROPERTIES TIMEOUT 600 ENVIRONMENT "${GM_PYTHON_TEST_ENV};${GM_PY_ENV};GPUMEM_HEAP=central")
  add_test(NAME python_gpumem_local
    COMMAND ${GM_TEST_PYTHON3} -m pytest -q -p no:cacheprovider ${CMAKE_CURRENT_LIST_DIR}/python)
  set_tests_properties(python_gpumem_local PROPERTIES TIMEOUT 600 ENVIRONMENT "${GM_PYTHON_TEST_ENV};${GM_PY_ENV};GPUMEM_HEAP=local")
endif()
if(GPUMEM_HAVE_CUDA AND TARGET fakecuda)
  # The same on the cuda backend over the emulated driver, two devices.
  add_dependencies(test_torch_alloc fakecuda)
  add_test(NAME torch_entry_points_cuda COMMAND test_torch_alloc)
  set(GM_TORCH_CUDA_ENV "GPUMEM_TEST_BACKEND=cuda;GPUMEM_LIBCUDA=${GPUMEM_FAKECUDA};FAKECUDA_CAPACITY=4G;FAKECUDA_DEVICE_COUNT=2")
  if(GPUMEMD_ASAN)
    # The library's sessions live until exit (PyTorch may free at any time),
    # and LeakSanitizer's tracer now and then crashes scanning this process at
    # exit while they run over the emulated driver. Leaks are checked by the
    # host variant; ASan and UBSan stay on here.
    string(APPEND GM_TORCH_CUDA_ENV ";ASAN_OPTIONS=detect_leaks=0")
  endif()
  set_tests_properties(torch_entry_points_cuda PROPERTIES TIMEOUT 600 ENVIRONMENT "${GM_TORCH_CUDA_ENV}")
endif()

# gpumem_torch_malloc's throw, from C++ as PyTorch calls it (C++ builds only).
if(CMAKE_CXX_COMPILER)
  enable_language(CXX) # in this directory too, as torch/ did
  add_executable(test_torch_oom ${CMAKE_CURRENT_LIST_DIR}/test_torch_oom.cpp)
  target_link_libraries(test_torch_oom PRIVATE gpumem_torch gpumem)
  set_target_properties(test_torch_oom PROPERTIES CXX_STANDARD 17)
  add_test(NAME torch_oom_throws COMMAND test_torch_oom)
  set_tests_properties(torch_oom_throws PROPERTIES ENVIRONMENT "GPUMEM_TORCH_QUIET=1")
endif()
