# gpumem-replay on every shipped trace, native and expandable, and through a
# daemon when it is built (functional only: nothing is timed).
find_package(Python3 REQUIRED COMPONENTS Interpreter)
set(GM_REPLAY_CHECK_ARGS $<TARGET_FILE:gpumem-replay> ${PROJECT_SOURCE_DIR}/bench/traces)
if(TARGET gpumemd)
  list(APPEND GM_REPLAY_CHECK_ARGS $<TARGET_FILE:gpumemd>)
endif()
add_test(NAME replay COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/replay_check.py ${GM_REPLAY_CHECK_ARGS})
set_tests_properties(replay PROPERTIES TIMEOUT 600)
