/* dirs.c - removing the agent's temporary files. */
#include "agent/dirs.h"

#include <dirent.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"

void agent_dirs_clear(const char *dir, const char *prefix, const char *what) {
  if (dir[0] == '\0') return;
  DIR *d = opendir(dir);
  if (d == NULL) return;
  size_t pl = strlen(prefix);
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
    if (strncmp(de->d_name, prefix, pl) != 0) continue;
    if (unlinkat(dirfd(d), de->d_name, 0) == 0 && what != NULL)
      base_log(BASE_LOG_INFO, "removed leftover %s %s/%s", what, dir, de->d_name);
  }
  closedir(d);
}

void agent_dirs_remove(const char *dir) {
  if (dir[0] == '\0') return;
  agent_dirs_clear(dir, "", NULL);
  rmdir(dir);
}
