# Run by `cmake --install` (packaging/CMakeLists.txt sets GM_UNIT_SOURCE_DIR,
# GM_BINDIR_REL, GM_LIBEXECDIR_REL, GM_SYSCONFDIR_REL and GM_CONFIG_SOURCE
# first): the systemd units, gpumemd-instances and gpumemd.conf for the
# prefix given at install time, so `cmake --install --prefix P` and `make
# install PREFIX=P` get units that name P's binaries and configuration. The
# configuration directory is /etc for the prefix /usr (the Debian layout),
# else P/etc (an absolute CMAKE_INSTALL_SYSCONFDIR is taken as it is), so
# nothing lands outside DESTDIR and P but for the system prefix.
function(gm_install_dir var relative)
  if(IS_ABSOLUTE "${relative}")
    set(${var} "${relative}" PARENT_SCOPE)
  else()
    set(${var} "${CMAKE_INSTALL_PREFIX}/${relative}" PARENT_SCOPE)
  endif()
endfunction()
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr" AND NOT IS_ABSOLUTE "${GM_SYSCONFDIR_REL}")
  set(GM_SYSCONFDIR /etc)
else()
  gm_install_dir(GM_SYSCONFDIR "${GM_SYSCONFDIR_REL}")
endif()
gm_install_dir(GM_BINDIR "${GM_BINDIR_REL}")
gm_install_dir(GM_LIBEXECDIR "${GM_LIBEXECDIR_REL}")

# configure_file() writes straight into the destination: each output is
# listed in install_manifest.txt as file(INSTALL) would.
function(gm_install_configured input destination)
  get_filename_component(name "${input}" NAME)
  string(REGEX REPLACE "\\.in$" "" name "${name}")
  set(path "${destination}/${name}")
  message(STATUS "Installing: $ENV{DESTDIR}${path}")
  configure_file("${GM_UNIT_SOURCE_DIR}/${input}" "$ENV{DESTDIR}${path}" @ONLY)
  list(APPEND CMAKE_INSTALL_MANIFEST_FILES "${path}")
  set(CMAKE_INSTALL_MANIFEST_FILES "${CMAKE_INSTALL_MANIFEST_FILES}" PARENT_SCOPE)
endfunction()

foreach(unit gpumemd.service.in gpumemd@.service.in gpumemd@.socket)
  gm_install_configured(${unit} "${CMAKE_INSTALL_PREFIX}/lib/systemd/system")
endforeach()
gm_install_configured(gpumemd-instances.in "${GM_LIBEXECDIR}/gpumemd")
if(EXISTS "${GM_CONFIG_SOURCE}")
  file(INSTALL "${GM_CONFIG_SOURCE}" DESTINATION "${GM_SYSCONFDIR}/gpumem")
endif()
