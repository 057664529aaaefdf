"""mloop detach by device, by image file, and --all each disconnect what
they name, stop its server and leave no per-device state."""
import json

from kfix import make_image, nbd_in_use, wait_until


def run_test(kind, cl):
    images = [make_image(cl, seed=i) for i in range(3)]
    atts = [kind.attach(cl, img) for img in images]
    devs = [a.device for a in atts]
    assert len(set(devs)) == 3, f"three attaches gave {devs}"

    # By image file: only that device goes.
    kind.cli("detach", images[0])
    atts[0].attached = False
    wait_until(lambda: not nbd_in_use(devs[0]), f"detach {images[0]} to free {devs[0]}", 5)
    assert all(nbd_in_use(d) for d in devs[1:]), "detach FILE disconnected other devices"
    listed = {e["device"] for e in json.loads(kind.cli("list", "--json").stdout)}
    assert listed == set(devs[1:]), f"after detach FILE, list shows {sorted(listed)}"

    # --all: the rest.
    kind.cli("detach", "--all")
    for a in atts[1:]:
        a.attached = False
    for a, img in zip(atts, images):
        problems = kind.leftovers(a, img)
        assert not problems, "; ".join(problems)
    assert json.loads(kind.cli("list", "--json").stdout) == [], "list not empty after --all"
