def test_boot(page, load_ember, run_python):
    info = load_ember(page, "/")
    print(info)
    assert run_python(page, "import ember; (ember.tensor([1.0, 2.0]) * 3).tolist()") == [3.0, 6.0]
