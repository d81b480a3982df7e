#!/usr/bin/python3
"""test_help.py MANDIR BINDIR - the man pages match the programs.

For every man page docs/man/<prog>.1 whose program was built: `cohort
--version` prints the page's version; the page's OPTIONS section lists the
options that `<prog> --help` shows and no other; and for every subsection
titled "<prog> <command>..." `<prog> <command>... --help` exits 0, every
option the subsection lists appears in that help, and every option the help
defines is in the subsection. Every command `cohort --help` lists has a
subsection.
"""
import os
import re
import subprocess
import sys

from checks import check, report

mandir, bindir = sys.argv[1], sys.argv[2]


def man_options(lines):
    """Options named on the tag line of each .TP entry."""
    opts = set()
    for i, line in enumerate(lines):
        if line.strip() == ".TP" and i + 1 < len(lines):
            tag = lines[i + 1].replace("\\-", "-")
            if not tag.lstrip(".BIR ").startswith("-"):
                continue  # an environment variable or other entry
            opts.update(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9_-]*|-[a-zA-Z])(?![\w-])", tag))
    return opts


def help_options(text):
    """Options the help text defines: those that start an indented line."""
    opts = set()
    for line in text.splitlines():
        m = re.match(r"^ {1,8}((?:-[a-zA-Z], )?--[a-z0-9][a-z0-9_-]*|-[a-zA-Z](?= ))", line)
        if m:
            opts.update(o.strip() for o in m.group(1).split(","))
    return opts


def run(argv):
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def check_section(prog, words, lines, top_level, complete):
    argv = [os.path.join(bindir, prog)] + words + ["--help"]
    name = " ".join([prog] + words)
    p = run(argv)
    check(p.returncode == 0, "%s --help exits 0 (got %d)" % (name, p.returncode))
    check(p.stdout.strip() != "", "%s --help prints to stdout" % name)
    mopts = man_options(lines)
    check(len(mopts) > 0, "%s: the man page lists options" % name)
    for o in sorted(mopts):
        if top_level and not o.startswith("--"):
            continue  # short aliases of the top-level options are not in its summary
        check(re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(o), p.stdout) is not None,
              "%s: option %s of the man page is not in --help" % (name, o))
    for o in sorted(help_options(p.stdout)) if complete else []:
        check(o in mopts, "%s: option %s of --help is not in the man page" % (name, o))


pages = sorted(f for f in os.listdir(mandir) if f.endswith(".1"))
check("cohort.1" in pages, "cohort.1 exists")
for page in pages:
    prog = page[:-2]
    if not os.path.exists(os.path.join(bindir, prog)):
        print("test_help: %s not built, page not checked" % prog)
        continue
    with open(os.path.join(mandir, page)) as f:
        text = f.read()
    lines = text.splitlines()
    th = re.search(r'^\.TH \S+ 1 "[^"]*" "(\S+) (\S+)"', text, re.M)
    check(th is not None and th.group(1) == "cohort", "%s: .TH names the package" % page)
    if prog == "cohort":
        p = run([os.path.join(bindir, prog), "--version"])
        check(p.returncode == 0 and th and p.stdout.strip() == "%s %s" % (prog, th.group(2)),
              "%s --version %r matches the page %r" % (prog, p.stdout, th and th.group(2)))

    # Split into the top-level OPTIONS section and the command subsections.
    sections, current, top = {}, None, []
    in_options = False
    for line in lines:
        if line.startswith(".SH"):
            in_options = line.split(None, 1)[1].strip('"') == "OPTIONS"
            current = None
            continue
        if line.startswith(".SS"):
            title = line.split(None, 1)[1].strip('"').split()
            check(title[0] == prog, "%s: subsection %r names the program" % (page, title))
            current = tuple(title[1:])
            sections[current] = []
            continue
        if current is not None:
            sections[current].append(line)
        elif in_options:
            top.append(line)
    check(len(top) > 0, "%s has an OPTIONS section" % page)
    check_section(prog, [], top, top_level=bool(sections), complete=True)
    for words, body in sections.items():
        check_section(prog, list(words), body, top_level=False, complete=True)

    if prog == "cohort":
        p = run([os.path.join(bindir, prog), "--help"])
        listed = re.findall(r"^  (\w+) ", p.stdout.split("commands:", 1)[-1], re.M)
        check(len(listed) > 0, "cohort --help lists commands")
        for cmd in listed:
            check(any(w[:1] == (cmd,) for w in sections),
                  "command %s has a subsection in cohort.1" % cmd)

sys.exit(report())
