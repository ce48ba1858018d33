"""One inotify instance, many views: each view gets the events it asked
for, on its own queue; views share the kernel's watch of one directory; one
task waits on the descriptor for all, and another takes over if it leaves."""

import contextlib

import trio
import trio.testing
from inotify_simple import flags as F

from powerdev.support.inotify import Inotify, Watcher

LIMIT = 10


def names(events):
    return [(e.name, e.mask & ~F.ISDIR) for e in events]


async def test_two_views_of_one_directory_get_each_their_own_events(tmp_path):
    with trio.fail_after(LIMIT), Inotify() as inotify:
        with Watcher(inotify) as creates, Watcher(inotify) as deletes:
            assert creates.add(tmp_path, F.CREATE) == deletes.add(tmp_path, F.DELETE)
            (tmp_path / "a").write_text("")
            (tmp_path / "a").unlink()
            assert names(await creates.events()) == [("a", F.CREATE)]
            assert names(await deletes.events()) == [("a", F.DELETE)]
        with Watcher(inotify) as later:  # the others left: their watch went with them
            later.add(tmp_path, F.DELETE)
            (tmp_path / "b").write_text("")
            (tmp_path / "b").unlink()
            assert names(await later.events()) == [("b", F.DELETE)]


async def test_a_view_that_leaves_keeps_a_shared_watch_for_the_other(tmp_path):
    with trio.fail_after(LIMIT), Inotify() as inotify, Watcher(inotify) as stays:
        stays.add(tmp_path, F.CREATE)
        with Watcher(inotify) as goes:
            goes.add(tmp_path, F.CREATE)
        (tmp_path / "c").write_text("")
        assert names(await stays.events()) == [("c", F.CREATE)]


@contextlib.contextmanager
def two_views(inotify, tmp_path):
    """Two views of one instance, each watching its own new directory for CREATE."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    with Watcher(inotify) as a, Watcher(inotify) as b:
        a.add(one, F.CREATE)
        b.add(two, F.CREATE)
        yield one, two, a, b


async def test_waiters_on_several_views_are_all_woken_and_take_over_from_each_other(tmp_path):
    with trio.fail_after(LIMIT), Inotify() as inotify, two_views(inotify, tmp_path) as views:
        one, two, a, b = views
        got = {}
        async with trio.open_nursery() as nursery:

            async def wait(name, view):
                got[name] = names(await view.events())

            first = trio.CancelScope()

            async def wait_then_leave():
                with first, Watcher(inotify) as idle:
                    await idle.wait()

            nursery.start_soon(wait_then_leave)  # the first to wait on the descriptor
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(wait, "a", a)
            nursery.start_soon(wait, "b", b)
            await trio.testing.wait_all_tasks_blocked()
            first.cancel()  # it leaves; a or b waits on the descriptor from now on
            await trio.testing.wait_all_tasks_blocked()
            (two / "x").write_text("")
            (one / "y").write_text("")
        assert got == {"a": [("y", F.CREATE)], "b": [("x", F.CREATE)]}


async def test_events_another_view_read_wake_the_view_that_waits_for_the_descriptor(tmp_path):
    # b waits on the descriptor; a's ready() (an Allocate applying queued
    # events, say) reads b's event off it: b must still wake.
    with trio.fail_after(LIMIT), Inotify() as inotify, two_views(inotify, tmp_path) as views:
        _, two, a, b = views
        async with trio.open_nursery() as nursery:
            got = []

            async def wait_b():
                got.extend(names(await b.events()))

            nursery.start_soon(wait_b)
            await trio.testing.wait_all_tasks_blocked()  # b waits on the descriptor
            (two / "z").write_text("")
            assert a.ready() == []  # reads the descriptor: z is b's
        assert got == [("z", F.CREATE)]


async def test_events_for_one_view_wake_no_other_waiter(tmp_path):
    """The kubelet writes its checkpoint beside our socket at every
    admission: the events go to the view watching that directory, and the
    task waiting on another view (here the one waiting on the descriptor
    for everyone, and one sleeping) does not run at all."""

    class Steps(trio.abc.Instrument):
        def __init__(self) -> None:
            self.by_task: dict[str, int] = {}

        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            self.by_task[task.name] = self.by_task.get(task.name, 0) + 1

    with trio.fail_after(LIMIT), Inotify() as inotify, two_views(inotify, tmp_path) as views:
        one, two, a, b = views
        third = tmp_path / "three"
        third.mkdir()
        with Watcher(inotify) as c:
            c.add(third, F.CREATE)
            got = []
            async with trio.open_nursery() as nursery:

                async def quiet_a() -> None:
                    await a.wait()

                async def quiet_c() -> None:
                    await c.wait()

                async def busy_b() -> None:
                    for _ in range(5):
                        got.extend(names(await b.events()))

                nursery.start_soon(quiet_a, name="quiet-a")  # waits on the descriptor
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(quiet_c, name="quiet-c")  # sleeps
                nursery.start_soon(busy_b, name="busy-b")
                await trio.testing.wait_all_tasks_blocked()
                steps = Steps()
                trio.lowlevel.add_instrument(steps)
                for i in range(5):
                    (two / f"x{i}").write_text("")
                    await trio.testing.wait_all_tasks_blocked()
                trio.lowlevel.remove_instrument(steps)
                assert len(got) == 5
                # quiet-a read the descriptor for everyone each time; quiet-c never ran
                assert steps.by_task.get("quiet-c", 0) == 0
                (one / "y").write_text("")  # quiet-a's own event ends it
                (third / "z").write_text("")  # quiet-c is woken to read next, and ends
            assert names(a.ready()) == [("y", F.CREATE)]
            assert names(c.ready()) == [("z", F.CREATE)]
