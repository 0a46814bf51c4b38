# install_units.cmake — run by `cmake --install`: the systemd units of deploy/systemd with their
# ExecStart pointing at this prefix's bin/ (the tracked units name /usr/local/bin).
# In: BATON_UNITS_SRC (the units' folder), BATON_BINDIR (relative bin dir); CMAKE_INSTALL_PREFIX
# is the prefix of this install (`--prefix` included).
set(dest "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}/lib/systemd/system")
file(MAKE_DIRECTORY "${dest}")
foreach(unit baton.service baton-worker@.service)
  file(READ "${BATON_UNITS_SRC}/${unit}" text)
  string(REPLACE "/usr/local/bin/" "${CMAKE_INSTALL_PREFIX}/${BATON_BINDIR}/" text "${text}")
  message(STATUS "Installing: ${dest}/${unit}")
  file(WRITE "${dest}/${unit}" "${text}")
endforeach()
